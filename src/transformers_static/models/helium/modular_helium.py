"""Helium (kyutai/helium-1-preview): Llama with rotary positions over INTERLEAVED pairs of each head (dims 2i,
2i + 1), an RMSNorm that scales in float32, and an `o_proj` without bias (`attention_bias` sets q/k/v's only)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import LlamaAttention, LlamaForCausalLM, LlamaRMSNorm


class HeliumConfig(LlamaConfig):
    """Upstream's fields and defaults (helium-1-preview's sizes, rope_theta 100000); no `pretraining_tp`, as
    upstream. Upstream's `o_proj` reads `hidden_size` inputs, so `num_attention_heads * head_dim` must equal it."""

    def __init__(
        self,
        vocab_size: int = 48000,
        hidden_size: int = 2560,
        intermediate_size: int = 7040,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 20,
        num_key_value_heads: int | None = 20,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        attention_dropout: float = 0.0,
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-8,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        pad_token_id: int | None = 3,
        eos_token_id: int | list[int] | None = 2,
        bos_token_id: int | None = 1,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=100000.0
        )
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
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
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.attention_dropout = attention_dropout
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        if num_attention_heads * self.head_dim != hidden_size:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) * head_dim ({self.head_dim}) must equal hidden_size "
                f"({hidden_size}): Helium's o_proj takes hidden_size inputs"
            )


class HeliumRMSNorm(LlamaRMSNorm):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight.float() * hidden_states).to(input_dtype)  # scaled in float32, then cast


# Written whole: the converter cannot yet merge a decorated method (`@torch.no_grad()` forward) into a parent class.
class HeliumRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, each frequency repeated for the two dims
    of its interleaved pair, computed in float32 (scaled by YaRN's attention factor with rope_type "yarn")."""

    def __init__(self, config: HeliumConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = freqs.repeat_interleave(2, dim=-1)  # [batch, q_len, head_dim]: f0, f0, f1, f1, ...
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


# Copied from transformers_static.models.gptj.modeling_gptj.rotate_every_two with rotate_every_two->rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs `(x0, x1), (x2, x3), ...` -> `(-x1, x0), (-x3, x2), ...`."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class HeliumAttention(LlamaAttention):
    """Llama's attention with `attention_bias` on q/k/v only: `o_proj` has no bias."""

    def __init__(self, config: HeliumConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)


class HeliumForCausalLM(LlamaForCausalLM):
    pass
