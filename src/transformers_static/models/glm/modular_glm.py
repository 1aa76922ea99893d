"""GLM (THUDM/glm-4-9b): Llama with a fused `gate_up_proj` SwiGLU MLP (as Phi-3), rotary positions on the leading
`partial_rotary_factor` share of each head (half by default) rotating INTERLEAVED pairs (dims 2i, 2i + 1), and
biases on the query/key/value projections only (`attention_bias`, on by default; never on `o_proj`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import LlamaAttention, LlamaForCausalLM


class GlmConfig(LlamaConfig):
    """Upstream's fields and defaults (glm-4-9b's sizes). The rotated share of each head lives, as upstream 5.x keeps
    it, in `rope_parameters["partial_rotary_factor"]` (0.5 unless given there or at the top level); `eos_token_id`
    None means upstream's three stop tokens. No `mlp_bias` or `pretraining_tp`, as upstream."""

    # Tensor parallelism (integrations/tensor_parallel.py): heads split as Llama's, the fused MLP by gate/up blocks.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_up_proj": "colwise_gate_up",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 151552,
        hidden_size: int = 4096,
        intermediate_size: int = 13696,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 2,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        attention_dropout: float = 0.0,
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1.5625e-07,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        pad_token_id: int | None = 151329,
        eos_token_id: int | list[int] | None = None,
        bos_token_id: int | None = None,
        attention_bias: bool = True,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        # upstream: the dict's own value wins over the top-level field, which defaults to a half
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.5))
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=[151329, 151336, 151338] if eos_token_id is None else eos_token_id,
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
        factor = rope_parameters["partial_rotary_factor"]
        rotary_ndims = int(self.head_dim * factor)  # the leading dims of each head that rotate, as upstream
        if not 0 < factor <= 1 or rotary_ndims % 2 or rotary_ndims == 0:
            raise ValueError(
                f"partial_rotary_factor ({factor}) must lie in (0, 1] and give an even, positive rotary_ndims "
                f"int(head_dim ({self.head_dim}) * partial_rotary_factor) = {rotary_ndims}: rotary positions "
                "rotate pairs of dims"
            )


# Written whole: the converter cannot yet merge a decorated method (`@torch.no_grad()` forward) into a parent class.
class GlmRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions (`rotary_ndims = int(head_dim *
    partial_rotary_factor)`), each frequency repeated for the two dims of its interleaved pair, computed in float32
    (scaled by YaRN's attention factor with rope_type "yarn")."""

    def __init__(self, config: GlmConfig) -> None:
        super().__init__()
        params = config.rope_parameters
        dim = int(config.head_dim * params["partial_rotary_factor"])
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_ndims // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, rotary_ndims // 2]
        emb = freqs.repeat_interleave(2, dim=-1)  # [batch, q_len, rotary_ndims]: f0, f0, f1, f1, ...
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


# Copied from transformers_static.models.gptj.modeling_gptj.rotate_every_two with rotate_every_two->rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs `(x0, x1), (x2, x3), ...` -> `(-x1, x0), (-x3, x2), ...`."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


# Copied from transformers_static.models.gptj.modeling_gptj.apply_rotary_pos_emb with rotate_every_two->rotate_half
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the interleaved pairs in the first `rotary_dim` dims of queries `[batch, heads, q_len, head_dim]` and
    keys by cos/sin `[batch, q_len, rotary_dim]`; the other dims pass through unchanged."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, rotary_dim]
    rotated = []
    for x in (q, k):
        x_rot = x[..., :rotary_dim]
        x_rot = x_rot * cos + rotate_half(x_rot) * sin
        rotated.append(torch.cat((x_rot, x[..., rotary_dim:]), dim=-1))  # [batch, heads, q_len, head_dim]
    return rotated[0], rotated[1]


# Copied from transformers_static.models.phi3.modeling_phi3.Phi3MLP with Phi3->Glm
class GlmMLP(nn.Module):
    """SwiGLU with gate and up fused in one projection: `gate_up_proj` gives `[gate | up]`."""

    def __init__(self, config: GlmConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.activation_fn = get_activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)  # each [batch, q_len, intermediate]
        return self.down_proj(up * self.activation_fn(gate))


class GlmAttention(LlamaAttention):
    """Llama's attention with `attention_bias` on q/k/v only: `o_proj` has no bias."""

    def __init__(self, config: GlmConfig, layer_idx: int) -> None:
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


class GlmForCausalLM(LlamaForCausalLM):
    pass
