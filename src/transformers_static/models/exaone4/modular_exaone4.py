"""EXAONE 4.0: Qwen3's attention (a per-head RMSNorm on queries and keys, no biases) in OLMo2's block (each sublayer
reads the raw residual stream and its output is normed before it is added back: `post_attention_layernorm`,
`post_feedforward_layernorm`), with sliding-window layers beside global ones (`layer_types`, by default every
`sliding_window_pattern`-th layer global). In such a hybrid only the sliding layers rotate queries and keys; the
global layers have no position encoding (without a `sliding_window` every layer is global and rotates).

A single 4D `attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind
its own 4D mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION, attention_type
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..qwen3.configuration_qwen3 import Qwen3Config, _check_layer_types
from ..qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3MLP,
    Qwen3RMSNorm,
    apply_rotary_pos_emb,
)


class Exaone4Config(Qwen3Config):
    """EXAONE 4.0's fields: no `head_dim` field (a config.json's is honoured, else `hidden_size // heads`), and
    `layer_types` derived, when the config lists none, from `sliding_window_pattern`: layer i is global when
    `(i + 1) % sliding_window_pattern == 0` and sliding otherwise; every layer is global without a `sliding_window`
    (or without a pattern). A pattern string ("LLLG") is refused unless `layer_types` is given (upstream cannot
    derive layer_types from it either)."""

    def __init__(
        self,
        vocab_size: int = 102400,
        hidden_size: int = 4096,
        intermediate_size: int = 16384,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        rope_parameters: dict[str, Any] | None = None,
        attention_dropout: float = 0.0,
        sliding_window: int | None = 4096,
        sliding_window_pattern: str | int | None = 4,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        head_dim = kwargs.pop("head_dim", None)
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
        if sliding_window is None:
            sliding_window_pattern = 0
        if layer_types is None:
            if isinstance(sliding_window_pattern, str):
                raise ValueError(
                    f"sliding_window_pattern {sliding_window_pattern!r} (a string) needs layer_types listed beside "
                    "it; give an int pattern (every n-th layer global) or layer_types"
                )
            layer_types = [
                SLIDING_ATTENTION if sliding_window_pattern and (i + 1) % sliding_window_pattern else FULL_ATTENTION
                for i in range(num_hidden_layers)
            ]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is None")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.sliding_window_pattern = sliding_window_pattern
        self.layer_types = list(layer_types)


del _check_layer_types


class Exaone4Attention(Qwen3Attention):
    """Llama's attention without biases, with an RMSNorm over each query and key head (`q_norm`, `k_norm`:
    `[head_dim]` weights shared by the heads) before the rotary positions, which only sliding layers apply when the
    model has a `sliding_window` (its global layers have none)."""

    def __init__(self, config: Exaone4Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.use_rope = config.sliding_window is None or attention_type(config, layer_idx) == SLIDING_ATTENTION
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

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
        # Normed per head on [batch, q_len, heads, head_dim], then [batch, heads, q_len, head_dim].
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [.., kv_heads, ..]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        if self.use_rope:
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


class Exaone4DecoderLayer(Qwen3DecoderLayer):
    """`h = x + norm(attn(x))`, then `h + norm(mlp(h))`: no norm on a sublayer's input (OLMo2's block)."""

    def __init__(self, config: Exaone4Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Exaone4Attention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.self_attn(
            hidden_states,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_output)
        return hidden_states + self.post_feedforward_layernorm(self.mlp(hidden_states))


class Exaone4ForCausalLM(Qwen3ForCausalLM):
    pass
