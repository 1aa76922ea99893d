"""Nemotron (Nemotron-3, Minitron): Llama with LayerNorm1P (a LayerNorm with bias whose scale is `weight + 1`), a
gate-free ReLU² MLP (`up_proj`, `down_proj`) and rotary positions on the leading `partial_rotary_factor` share of
each head (half by default)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaRMSNorm,
    rotate_half,
)


class NemotronConfig(LlamaConfig):
    """Upstream's fields and defaults (nemotron-15b's sizes): `norm_eps` for the LayerNorms, no `rms_norm_eps`
    or `pretraining_tp`. The rotated share of each head lives, as upstream 5.x keeps it, in
    `rope_parameters["partial_rotary_factor"]` (0.5 unless given there or at the top level, as older config.json
    files have it)."""

    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 256000,
        hidden_size: int = 6144,
        intermediate_size: int = 24576,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 48,
        head_dim: int | None = None,
        num_key_value_heads: int | None = None,
        hidden_act: str = "relu2",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.0134,
        norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 2,
        eos_token_id: int | list[int] | None = 3,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        # upstream: the dict's own value wins over the top-level field, which defaults to a half
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.5))
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
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.norm_eps = norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        factor = rope_parameters["partial_rotary_factor"]
        rotary_ndims = int(self.head_dim * factor)  # the leading dims of each head that rotate, as upstream
        if not 0 < factor <= 1 or rotary_ndims % 2 or rotary_ndims == 0:
            raise ValueError(
                f"partial_rotary_factor ({factor}) must lie in (0, 1] and give an even, positive rotary_ndims "
                f"int(head_dim ({self.head_dim}) * partial_rotary_factor) = {rotary_ndims}: rotary positions "
                "rotate pairs of dims"
            )


del LlamaRMSNorm


class NemotronLayerNorm1P(nn.LayerNorm):
    """LayerNorm (with bias) scaling by `weight + 1`: checkpoints store the scale centred on zero."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(hidden_states, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)


class NemotronRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions, computed in float32, for the leading
    `rotary_ndims = int(head_dim * partial_rotary_factor)` dims of each head (scaled by YaRN's attention factor with
    rope_type "yarn")."""

    def __init__(self, config: NemotronConfig) -> None:
        super().__init__()
        params = config.rope_parameters
        dim = int(config.head_dim * params["partial_rotary_factor"])
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_ndims // 2]

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.forward with head_dim->rotary_ndims
    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, rotary_ndims // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, rotary_ndims]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the leading `rotary_ndims` dims of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, rotary_ndims]` (the halves of that share pair up); the other dims pass through unchanged."""
    rotary_ndims = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, rotary_ndims]
    q_rot, k_rot = q[..., :rotary_ndims], k[..., :rotary_ndims]
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = k_rot * cos + rotate_half(k_rot) * sin
    return torch.cat((q_rot, q[..., rotary_ndims:]), dim=-1), torch.cat((k_rot, k[..., rotary_ndims:]), dim=-1)


# Copied from transformers_static.models.arcee.modeling_arcee.ArceeMLP with Arcee->Nemotron
class NemotronMLP(nn.Module):
    """Gate-free: `down_proj(act(up_proj(x)))`, ReLU² by default."""

    def __init__(self, config: NemotronConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))


class NemotronDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: NemotronConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = NemotronMLP(config)
        self.input_layernorm = NemotronLayerNorm1P(config.hidden_size, eps=config.norm_eps)
        self.post_attention_layernorm = NemotronLayerNorm1P(config.hidden_size, eps=config.norm_eps)


class NemotronModel(LlamaModel):
    def __init__(self, config: NemotronConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(NemotronDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = NemotronLayerNorm1P(config.hidden_size, eps=config.norm_eps)
        self.rotary_emb = NemotronRotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()


class NemotronForCausalLM(LlamaForCausalLM):
    pass
