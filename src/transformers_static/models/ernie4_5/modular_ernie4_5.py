"""Ernie 4.5 (Baidu, dense): Llama with rotary positions over INTERLEAVED pairs of each head (dims 2i, 2i + 1),
cos/sin kept in float32 and the rotation computed in float32, and one `use_bias` switch for every projection
(attention q/k/v/o and MLP gate/up/down)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import LlamaAttention, LlamaForCausalLM, LlamaMLP


class Ernie4_5Config(LlamaConfig):
    """Upstream's fields and defaults (ERNIE-4.5-0.3B's sizes, rope_theta 500000, `head_dim` 128 unless given as
    None); `use_bias` for every projection; no `attention_bias`, `mlp_bias`, `attention_dropout` or
    `pretraining_tp`, as upstream (its attention never drops out)."""

    def __init__(
        self,
        vocab_size: int = 103424,
        hidden_size: int = 1024,
        intermediate_size: int = 3072,
        num_hidden_layers: int = 18,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 2,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        use_bias: bool = False,
        head_dim: int | None = 128,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=500000.0
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
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
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.use_bias = use_bias
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads


# Written whole: the converter cannot yet merge a decorated method (`@torch.no_grad()` forward) into a parent class.
class Ernie4_5RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, each frequency repeated for the two dims
    of its interleaved pair, computed and returned in float32 whatever the model's dtype (as upstream), scaled by
    YaRN's attention factor with rope_type "yarn"."""

    def __init__(self, config: Ernie4_5Config) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = freqs.repeat_interleave(2, dim=-1)  # [batch, q_len, head_dim]: f0, f0, f1, f1, ...
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


# Copied from transformers_static.models.gptj.modeling_gptj.rotate_every_two with rotate_every_two->rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs `(x0, x1), (x2, x3), ...` -> `(-x1, x0), (-x3, x2), ...`."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


# Copied from transformers_static.models.cohere2.modeling_cohere2.apply_rotary_pos_emb with rotate_every_two->rotate_half
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the interleaved pairs of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, head_dim]`, in float32 (as upstream), returned in the queries' dtype."""
    cos, sin = cos[:, None].float(), sin[:, None].float()  # [batch, 1, q_len, head_dim]
    rotated = [x.float() * cos + rotate_half(x.float()) * sin for x in (q, k)]
    return rotated[0].to(q.dtype), rotated[1].to(k.dtype)


class Ernie4_5MLP(LlamaMLP):
    def __init__(self, config: Ernie4_5Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.act_fn = get_activation(config.hidden_act)


class Ernie4_5Attention(LlamaAttention):
    """Llama's attention with `use_bias` on q/k/v/o and no dropout (upstream's attention never drops out)."""

    def __init__(self, config: Ernie4_5Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = 0.0
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.use_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.use_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.use_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.use_bias)


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    pass
