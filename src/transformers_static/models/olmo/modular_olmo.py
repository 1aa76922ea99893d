"""OLMo: Llama with non-parametric LayerNorms (no weight, no bias), bias-free MLP, float32 rotary tables and
optional `clip_qkv` clamping of the query/key/value projections."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    LlamaRMSNorm,
    rotate_half,
)


class OlmoConfig(LlamaConfig):
    """Llama's fields without `rms_norm_eps`, `mlp_bias`, `pretraining_tp` and `head_dim` (heads are
    `hidden_size // num_attention_heads`), with OLMo's defaults and `clip_qkv`: when set, every element of the query,
    key and value projections is clamped to `[-clip_qkv, clip_qkv]`."""

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 50279,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        clip_qkv: float | None = None,
        **kwargs: Any,
    ) -> None:
        given_head_dim = kwargs.pop("head_dim", None)
        if given_head_dim is not None and given_head_dim != hidden_size // num_attention_heads:
            raise ValueError(
                f"head_dim ({given_head_dim}) must be hidden_size // num_attention_heads "
                f"({hidden_size // num_attention_heads}): OLMo has no head_dim field of its own"
            )
        if clip_qkv is not None and not clip_qkv > 0:
            raise ValueError(f"clip_qkv ({clip_qkv}) must be None or positive")
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.clip_qkv = clip_qkv

    # Not a config.json field (as upstream): always `hidden_size // num_attention_heads`.
    head_dim = property(lambda self: self.hidden_size // self.num_attention_heads)


del LlamaRMSNorm


class OlmoLayerNorm(nn.Module):
    """LayerNorm without weight or bias (eps 1e-5), computed in float32 and cast back."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.normalized_shape = (hidden_size,)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        normed = nn.functional.layer_norm(hidden_states.float(), self.normalized_shape, None, None, eps=1e-5)
        return normed.to(hidden_states.dtype)


# Written whole: the modular converter mis-indents a merged method that has a decorator.
class OlmoRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, in float32 whatever the model dtype (the
    rotation is computed in float32 and cast back, as upstream)."""

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.__init__ with Llama->Olmo
    def __init__(self, config: OlmoConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by float32 cos/sin `[batch, q_len, head_dim]`;
    the results are cast back to the queries' and keys' dtypes."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    q_embed = q * cos + rotate_half(q) * sin
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


class OlmoMLP(LlamaMLP):
    """Llama's SwiGLU MLP, always without biases."""

    def __init__(self, config: OlmoConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)


class OlmoAttention(LlamaAttention):
    """Llama's attention with the query, key and value projections clamped to `[-clip_qkv, clip_qkv]` (when set)
    before the split into heads."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query, key, value = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        clip = self.config.clip_qkv
        if clip is not None:
            query, key, value = (states.clamp(min=-clip, max=clip) for states in (query, key, value))
        query = query.view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = key.view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = value.view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
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
        return self.o_proj(attn_output)


class OlmoDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: OlmoConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = OlmoAttention(config, layer_idx)
        self.mlp = OlmoMLP(config)
        self.input_layernorm = OlmoLayerNorm(config.hidden_size)
        self.post_attention_layernorm = OlmoLayerNorm(config.hidden_size)


class OlmoModel(LlamaModel):
    def __init__(self, config: OlmoConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(OlmoDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = OlmoLayerNorm(config.hidden_size)
        self.rotary_emb = OlmoRotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()


class OlmoForCausalLM(LlamaForCausalLM):
    pass
