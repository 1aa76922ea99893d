"""GPT-Neo: learned absolute positions, global (full causal) and local (sliding-window) attention layers as
`attention_types` lists them, separate q/k/v projections without bias, and no 1/sqrt(head_dim) scaling of the
scores."""

from __future__ import annotations

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
from .configuration_gpt_neo import GPTNeoConfig


class GPTNeoSelfAttention(nn.Module):
    """Causal self-attention with unscaled scores (`q k`, as GPT-Neo was trained). A local layer's window is in
    its mask (the converter's `sliding_attention` kind), not here."""

    def __init__(self, config: GPTNeoConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_heads
        self.attention_dropout = config.attention_dropout
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)
        self.resid_dropout = nn.Dropout(config.resid_dropout)

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
            scaling=1.0,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.resid_dropout(self.out_proj(attn_output))


class GPTNeoAttention(nn.Module):
    """Upstream's wrapper around the self-attention (kept so checkpoint keys read `attn.attention.q_proj`)."""

    def __init__(self, config: GPTNeoConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = GPTNeoSelfAttention(config, layer_idx)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        return self.attention(hidden_states, attention_mask, cache_position, past_key_values)


class GPTNeoMLP(nn.Module):
    def __init__(self, intermediate_size: int, config: GPTNeoConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.hidden_size, intermediate_size)
        self.c_proj = nn.Linear(intermediate_size, config.hidden_size)
        self.act = get_activation(config.activation_function)
        self.dropout = nn.Dropout(config.resid_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class GPTNeoBlock(nn.Module):
    """Pre-LayerNorm block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`; the attention reads its kind's mask."""

    def __init__(self, config: GPTNeoConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        inner_dim = config.intermediate_size if config.intermediate_size is not None else 4 * config.hidden_size
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.attn = GPTNeoAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = GPTNeoMLP(inner_dim, config)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.attn(
            self.ln_1(hidden_states),
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPTNeoPreTrainedModel(PreTrainedModel):
    config_class = GPTNeoConfig
    base_model_prefix = "transformer"
    # The original checkpoints (EleutherAI/gpt-neo-*) saved the causal-mask buffers `attn.attention.bias` and
    # `attn.attention.masked_bias`.
    _keys_to_ignore_on_load_unexpected = [r"\.attn\.attention\.bias$", r"\.attn\.attention\.masked_bias$"]

    def __init__(self, config: GPTNeoConfig) -> None:
        super().__init__(config)
        config.validate()

    @property
    def max_positions(self) -> int:
        """Length of the learned position table: every position id must lie in `[0, max_position_embeddings)`."""
        return self.config.max_position_embeddings


class GPTNeoModel(GPTNeoPreTrainedModel):
    def __init__(self, config: GPTNeoConfig) -> None:
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.drop = nn.Dropout(config.embed_dropout)
        self.h = nn.ModuleList(GPTNeoBlock(config, i) for i in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mask_converters = mask_converters(config)  # one per kind the layers use: full, sliding
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPast:
        """Final hidden states `[batch, q_len, hidden]`. Positions come from `position_ids`, else from the 2D
        padding mask's cumsum (left-padded rows start at 0), else from `cache_position`. A 4D mask is used as
        given by every layer; a dict of 4D masks by kind gives global and local layers their own."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.wte)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = self.drop(inputs_embeds + self.wpe(inputs.position_ids))  # [batch, q_len, hidden]
        for block in self.h:
            hidden_states = block(hidden_states, inputs)
        hidden_states = self.ln_f(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class GPTNeoForCausalLM(CausalLMMixin, GPTNeoPreTrainedModel):
    """GPT-Neo with a language-model head, tied to the token embeddings by default (`tie_word_embeddings`)."""

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: GPTNeoConfig) -> None:
        super().__init__(config)
        self.transformer = GPTNeoModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
