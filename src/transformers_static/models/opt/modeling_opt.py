"""OPT: learned absolute positions offset by 2, pre- or post-LayerNorm blocks, optional embedding projection.

Positions are `inputs.position_ids`, prepared once per forward (given, else from the 2D mask, else
`cache_position`), so every mask form works (docs/ARCHITECTURE.md, "Differences from upstream")."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_utils import PreTrainedModel
from .configuration_opt import OPTConfig


class OPTLearnedPositionalEmbedding(nn.Embedding):
    """The position table, `max_position_embeddings + 2` rows: position p reads row p + 2 (a fairseq legacy, kept
    so checkpoints load unchanged). Upstream gives padding tokens position -1 (row 1); ours clamps them to 0."""

    offset = 2

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings + self.offset, embedding_dim)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """`[batch, q_len]` positions -> `[batch, q_len, hidden]` embeddings."""
        return super().forward(position_ids + self.offset)


class OPTAttention(nn.Module):
    def __init__(self, config: OPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.embed_dim = config.hidden_size
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=config.enable_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        # The query is scaled before the product, as upstream and fairseq do, so the kernel runs with scaling=1.
        query = self.q_proj(hidden_states) * self.scaling  # [batch, q_len, hidden]
        query = query.view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        attn_output = attention_forward(
            self,
            query,
            key,
            value,
            attention_mask,
            cache_position=cache_position,
            past_key_values=past_key_values,
            scaling=1.0,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.out_proj(attn_output)


class OPTDecoderLayer(nn.Module):
    """Pre-LayerNorm (`x + f(norm(x))`, most OPT sizes) or post-LayerNorm (`norm(x + f(x))`, OPT-350m) block, for
    the attention and the ReLU feed-forward (`fc1`, `fc2`) alike."""

    def __init__(self, config: OPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.do_layer_norm_before = config.do_layer_norm_before
        affine = config.layer_norm_elementwise_affine
        self.self_attn = OPTAttention(config, layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_dim, bias=config.enable_bias)
        self.fc2 = nn.Linear(config.ffn_dim, config.hidden_size, bias=config.enable_bias)
        self.activation_fn = get_activation(config.activation_function)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        def attend(states: torch.Tensor) -> torch.Tensor:
            return self.self_attn(
                states,
                attention_mask=inputs.masks[self.attention_type],
                cache_position=inputs.cache_position,
                past_key_values=inputs.past_key_values,
            )

        hidden_states = self._residual(hidden_states, self.self_attn_layer_norm, attend)
        return self._residual(hidden_states, self.final_layer_norm, self._feed_forward)

    def _feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))

    def _residual(
        self, hidden_states: torch.Tensor, norm: nn.LayerNorm, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """One residual branch, with its LayerNorm before the sublayer or after the sum."""
        if self.do_layer_norm_before:
            return hidden_states + self.dropout(sublayer(norm(hidden_states)))
        return norm(hidden_states + self.dropout(sublayer(hidden_states)))


class OPTPreTrainedModel(PreTrainedModel):
    config_class = OPTConfig
    base_model_prefix = "model"

    def __init__(self, config: OPTConfig) -> None:
        super().__init__(config)
        config.validate()

    min_position = -2  # the offset rows: upstream gives padding tokens position -1

    @property
    def max_positions(self) -> int:
        """Length of the learned position table (less its offset rows): every position id must lie in
        `[0, max_position_embeddings)`."""
        return self.config.max_position_embeddings


class OPTDecoder(OPTPreTrainedModel):
    """Token and position embeddings, the decoder layers, the final LayerNorm (pre-norm models only), and the
    projections between `word_embed_proj_dim` and `hidden_size` when they differ."""

    def __init__(self, config: OPTConfig) -> None:
        super().__init__(config)
        self.layerdrop = config.layerdrop
        self.embed_tokens = nn.Embedding(config.vocab_size, config.word_embed_proj_dim, config.pad_token_id)
        self.embed_positions = OPTLearnedPositionalEmbedding(config.max_position_embeddings, config.hidden_size)
        projected = config.word_embed_proj_dim != config.hidden_size
        self.project_out = nn.Linear(config.hidden_size, config.word_embed_proj_dim, bias=False) if projected else None
        self.project_in = nn.Linear(config.word_embed_proj_dim, config.hidden_size, bias=False) if projected else None
        self.final_layer_norm = None
        if config.do_layer_norm_before and not config._remove_final_layer_norm:
            self.final_layer_norm = nn.LayerNorm(
                config.hidden_size, elementwise_affine=config.layer_norm_elementwise_affine
            )
        self.layers = nn.ModuleList(OPTDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.mask_converters = mask_converters(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPast:
        """Final hidden states `[batch, q_len, word_embed_proj_dim]`. Positions come from `position_ids`, else from
        the 2D padding mask's cumsum (left-padded rows start at 0), else from `cache_position`."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, proj_dim]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        if self.project_in is not None:
            inputs_embeds = self.project_in(inputs_embeds)  # [batch, q_len, hidden]
        hidden_states = inputs_embeds + self.embed_positions(inputs.position_ids)
        for layer in self.layers:
            if self.training and self.layerdrop > 0 and random.random() < self.layerdrop:
                continue  # LayerDrop (training only): skip the whole layer
            hidden_states = layer(hidden_states, inputs)
        if self.final_layer_norm is not None:
            hidden_states = self.final_layer_norm(hidden_states)
        if self.project_out is not None:
            hidden_states = self.project_out(hidden_states)  # [batch, q_len, proj_dim]
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class OPTModel(OPTPreTrainedModel):
    """The bare decoder under upstream's module names (`decoder.*`), so checkpoint keys match."""

    def __init__(self, config: OPTConfig) -> None:
        super().__init__(config)
        self.decoder = OPTDecoder(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPast:
        """The decoder's output; see `OPTDecoder.forward`."""
        return self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
        )


class OPTForCausalLM(CausalLMMixin, OPTPreTrainedModel):
    """OPT with a language-model head over `word_embed_proj_dim`, tied to the token embeddings by default."""

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: OPTConfig) -> None:
        super().__init__(config)
        self.model = OPTModel(config)
        self.lm_head = nn.Linear(config.word_embed_proj_dim, config.vocab_size, bias=False)
        self.post_init()
