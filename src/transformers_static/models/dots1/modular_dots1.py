"""dots.llm1 (rednote-hilab/dots.llm1.base, .inst): GLM-4.5's sparse layers (DeepSeek-V3's sigmoid router, grouped
choice with `e_score_correction_bias`, shared experts, dense first layers) on Qwen3's attention: per-head q/k
RMSNorms on every layer, `attention_bias` on all four projections, rotary positions on the whole head, and sliding
windows on the layers at or beyond `max_window_layers` (or as `layer_types` lists them).

The experts are stacked and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..glm4_moe.configuration_glm4_moe import Glm4MoeConfig, _check_experts
from ..glm4_moe.modeling_glm4_moe import (
    Glm4MoeAttention,
    Glm4MoeForCausalLM,
    Glm4MoePreTrainedModel,
    Glm4MoeRMSNorm,
    Glm4MoeRotaryEmbedding,
    head_dim,
    rotate_half,
)


class Dots1Config(Glm4MoeConfig):
    """Upstream's fields and defaults (dots.llm1's sizes; the expert counts default to None, as upstream, and must
    be given to build a model). `n_routed_experts` experts (alias `num_local_experts`) of width
    `moe_intermediate_size`, `num_experts_per_tok` per token from the best `topk_group` of `n_group` groups; layers
    from `first_k_dense_replace` on are sparse. `layer_types` (one of "full_attention" / "sliding_attention" per
    layer) is derived, as upstream, unless the config lists it: sliding, over `sliding_window` keys, on the layers
    at or beyond `max_window_layers`. No `use_sliding_window` field: upstream windows whenever `sliding_window` is
    set and a layer is past `max_window_layers`. `head_dim` is not a field (a config.json may hold one)."""

    model_type = "dots1"
    attribute_map = {"num_local_experts": "n_routed_experts"}

    def __init__(
        self,
        vocab_size: int = 152064,
        hidden_size: int = 4608,
        intermediate_size: int = 10944,
        moe_intermediate_size: int = 1408,
        num_hidden_layers: int = 62,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        n_shared_experts: int | None = None,
        n_routed_experts: int | None = None,
        output_router_logits: bool = False,
        n_group: int = 1,
        topk_group: int = 1,
        num_experts_per_tok: int | None = None,
        first_k_dense_replace: int = 0,
        norm_topk_prob: bool = False,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        routed_scaling_factor: float = 1.0,
        sliding_window: int | None = 4096,
        max_window_layers: int = 62,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        n_routed_experts = kwargs.pop("num_local_experts", n_routed_experts)
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
        if n_routed_experts is not None and num_experts_per_tok is not None:
            _check_experts(num_experts_per_tok, n_routed_experts)
            self.check_groups(n_routed_experts, n_group, topk_group, num_experts_per_tok)
        if layer_types is None:
            layer_types = [
                SLIDING_ATTENTION if sliding_window is not None and i >= max_window_layers else FULL_ATTENTION
                for i in range(num_hidden_layers)
            ]
        self.check_layer_types(layer_types, num_hidden_layers, sliding_window)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.n_shared_experts = n_shared_experts
        self.n_routed_experts = n_routed_experts
        self.output_router_logits = output_router_logits
        self.n_group = n_group
        self.topk_group = topk_group
        self.num_experts_per_tok = num_experts_per_tok
        self.first_k_dense_replace = first_k_dense_replace
        self.norm_topk_prob = norm_topk_prob
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.routed_scaling_factor = routed_scaling_factor
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.layer_types = list(layer_types)

    @staticmethod
    def check_layer_types(layer_types: list[str], num_hidden_layers: int, sliding_window: int | None) -> None:
        """One known kind per layer, and a window for the sliding ones."""
        if len(layer_types) != num_hidden_layers:
            raise ValueError(
                f"layer_types must list one kind per layer ({num_hidden_layers}), got {len(layer_types)}: {layer_types}"
            )
        unknown = sorted(set(layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION})
        if unknown:
            raise ValueError(f"layer_types may only hold {FULL_ATTENTION!r} and {SLIDING_ATTENTION!r}, got {unknown}")
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is None")


class Dots1RotaryEmbedding(Glm4MoeRotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32."""

    def __init__(self, config: Dots1Config) -> None:
        super().__init__()
        params = config.rope_parameters
        inv_freq, self.attention_scaling = rope_frequencies(params, head_dim(config), config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]


# Copied from transformers_static.models.llama.modeling_llama.apply_rotary_pos_emb
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Dots1Attention(Glm4MoeAttention):
    """Qwen3's attention: `attention_bias` on all four projections, an RMSNorm over each query and key head
    (`q_norm`, `k_norm`: `[head_dim]` weights shared by the heads) before the rotary positions, on every layer."""

    def __init__(self, config: Dots1Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = Dots1RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Dots1RMSNorm(self.head_dim, eps=config.rms_norm_eps)

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


class Dots1RMSNorm(Glm4MoeRMSNorm):
    pass


class Dots1PreTrainedModel(Glm4MoePreTrainedModel):
    @property
    def _keys_to_ignore_on_load_unexpected(self) -> list[str]:
        """Nothing: dots.llm1's checkpoints hold no layers beyond the decoder's."""
        return []


class Dots1ForCausalLM(Glm4MoeForCausalLM):
    pass
