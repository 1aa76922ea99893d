"""BioGPT: learned absolute positions offset by 2 (OPT's table), scaled token embeddings, pre-LayerNorm blocks with
biases, and the head under its checkpoint name `output_projection`.

Positions are `inputs.position_ids`, prepared once per forward (given, else from the 2D mask, else
`cache_position`), so left-padded rows start at 0 and every mask form works."""

from __future__ import annotations

import math
import random

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
from .configuration_biogpt import BioGptConfig


# Copied from transformers_static.models.opt.modeling_opt.OPTLearnedPositionalEmbedding with OPT->BioGpt
class BioGptLearnedPositionalEmbedding(nn.Embedding):
    """The position table, `max_position_embeddings + 2` rows: position p reads row p + 2 (a fairseq legacy, kept
    so checkpoints load unchanged). Upstream gives padding tokens position -1 (row 1); ours clamps them to 0."""

    offset = 2

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings + self.offset, embedding_dim)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """`[batch, q_len]` positions -> `[batch, q_len, hidden]` embeddings."""
        return super().forward(position_ids + self.offset)


# Copied from transformers_static.models.xglm.modeling_xglm.XGLMScaledWordEmbedding with XGLM->BioGpt
class BioGptScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale` (sqrt(d_model) with `scale_embedding`, else 1). Embeddings passed as
    `inputs_embeds` are used as given, unscaled, as upstream does."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`[batch, q_len]` ids -> `[batch, q_len, hidden]` scaled embeddings."""
        return super().forward(input_ids) * self.embed_scale


class BioGptAttention(nn.Module):
    def __init__(self, config: BioGptConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.embed_dim = config.hidden_size
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
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
            scaling=self.scaling,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.out_proj(attn_output)


class BioGptDecoderLayer(nn.Module):
    """Pre-LayerNorm block: `x + attn(norm(x))`, then `x + fc2(act(fc1(norm(x))))`. The LayerNorms use torch's
    default eps, as upstream's (config.layer_norm_eps is not read there)."""

    def __init__(self, config: BioGptConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = BioGptAttention(config, layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size)
        self.activation_fn = get_activation(config.hidden_act)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        attn_output = self.self_attn(
            self.self_attn_layer_norm(hidden_states),
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.dropout(attn_output)
        feed_forward = self.activation_dropout(self.activation_fn(self.fc1(self.final_layer_norm(hidden_states))))
        return hidden_states + self.dropout(self.fc2(feed_forward))


class BioGptPreTrainedModel(PreTrainedModel):
    config_class = BioGptConfig
    base_model_prefix = "biogpt"

    def __init__(self, config: BioGptConfig) -> None:
        super().__init__(config)
        config.validate()

    min_position = -2  # the offset rows: upstream gives padding tokens position -1

    @property
    def max_positions(self) -> int:
        """Length of the learned position table (less its offset rows): every position id must lie in
        `[0, max_position_embeddings)`."""
        return self.config.max_position_embeddings


class BioGptModel(BioGptPreTrainedModel):
    """Scaled token embeddings plus learned positions, the decoder layers, and the final LayerNorm."""

    def __init__(self, config: BioGptConfig) -> None:
        super().__init__(config)
        self.layerdrop = config.layerdrop
        embed_scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        self.embed_tokens = BioGptScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, embed_scale
        )
        self.embed_positions = BioGptLearnedPositionalEmbedding(config.max_position_embeddings, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(BioGptDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.layer_norm = nn.LayerNorm(config.hidden_size)
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
        """Final hidden states `[batch, q_len, hidden]`. Positions come from `position_ids`, else from the 2D
        padding mask's cumsum (left-padded rows start at 0), else from `cache_position`."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = self.dropout(inputs_embeds + self.embed_positions(inputs.position_ids))
        for layer in self.layers:
            if self.training and self.layerdrop > 0 and random.random() < self.layerdrop:
                continue  # LayerDrop (training only): skip the whole layer
            hidden_states = layer(hidden_states, inputs)
        hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class BioGptForCausalLM(CausalLMMixin, BioGptPreTrainedModel):
    """BioGPT with its head `output_projection`, the name every checkpoint (and upstream) uses, tied to the token
    embeddings by default; `lm_head` is the same module under the name CausalLMMixin calls."""

    _tied_weights_keys = {"output_projection.weight": "biogpt.embed_tokens.weight"}
    _tp_plan = {"output_projection": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: BioGptConfig) -> None:
        super().__init__(config)
        self.biogpt = BioGptModel(config)
        self.output_projection = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @property
    def lm_head(self) -> nn.Linear:
        return self.output_projection
