"""K-EXAONE (EXAONE-MoE, LGAI-EXAONE/K-EXAONE-236B-A23B): GLM-4.5's pre-norm layers, DeepSeek-V3 router and shared
experts with EXAONE 4.0's attention: per-head q/k RMSNorms (no biases), sliding-window layers beside global ones
(`layer_types`, by default every `sliding_window_pattern`-th layer global), and in such a hybrid rotary positions
on the sliding layers only (the global layers have none; without a `sliding_window` every layer rotates, over the
whole head). A router scores every expert by the sigmoid of its float32 logit, chooses among the best `topk_group`
of `n_group` groups by those scores plus `e_score_correction_bias`, and weighs the chosen experts by their
unbiased scores (renormalised when `norm_topk_prob`, times `routed_scaling_factor`); `num_shared_experts` always-on
experts add to every token. `mlp_layer_types` says which layers are sparse (default: dense before
`first_k_dense_replace`). No auxiliary loss, as upstream.

The experts are stacked and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`;
the router's correction bias is saved beside the router as upstream saves it, `mlp.e_score_correction_bias`. The
multi-token-prediction weights (`mtp.*`) of published checkpoints are ignored on load, as upstream ignores them.
A single 4D `attention_mask` is used as given by every layer; pass a dict `{"full_attention": ...,
"sliding_attention": ...}` to give each kind its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION, attention_type
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..glm4_moe.configuration_glm4_moe import Glm4MoeConfig, _check_experts
from ..glm4_moe.modeling_glm4_moe import (
    Glm4MoeAttention,
    Glm4MoeDecoderLayer,
    Glm4MoeExperts,
    Glm4MoeForCausalLM,
    Glm4MoeMLP,
    Glm4MoeMoE,
    Glm4MoePreTrainedModel,
    Glm4MoeRMSNorm,
    Glm4MoeRotaryEmbedding,
    Glm4MoeTopkRouter,
    apply_rotary_pos_emb,
    head_dim,
)


class ExaoneMoeConfig(Glm4MoeConfig):
    """Upstream's fields and defaults. `num_experts` experts (aliases `num_local_experts`, `n_routed_experts`) of
    width `moe_intermediate_size`, `num_experts_per_tok` per token from the best `topk_group` of `n_group` groups,
    `num_shared_experts` (alias `n_shared_experts`) shared ones as one MLP; `mlp_layer_types` ("dense" / "sparse" per
    layer) or, without it, dense layers before `first_k_dense_replace`. Attention as EXAONE 4.0's: `layer_types`
    derived from an int `sliding_window_pattern` (layer i global when `(i + 1) % pattern == 0`; every layer global
    without a `sliding_window`); a pattern string is refused unless `layer_types` is given (upstream cannot derive
    them from it either). As upstream, `head_dim` is not a field (a config.json's is honoured)."""

    model_type = "exaone_moe"
    attribute_map = {
        "num_local_experts": "num_experts",
        "n_routed_experts": "num_experts",
        "n_shared_experts": "num_shared_experts",
    }

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
        mlp_layer_types: list[str] | None = None,
        first_k_dense_replace: int = 1,
        moe_intermediate_size: int = 1024,
        num_experts: int = 64,
        num_experts_per_tok: int = 8,
        num_shared_experts: int = 1,
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 2.5,
        n_group: int = 1,
        topk_group: int = 1,
        output_router_logits: bool = False,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 53,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        num_experts = kwargs.pop("num_local_experts", kwargs.pop("n_routed_experts", num_experts))
        num_shared_experts = kwargs.pop("n_shared_experts", num_shared_experts)
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
        if mlp_layer_types is None:
            mlp_layer_types = ["dense" if i < first_k_dense_replace else "sparse" for i in range(num_hidden_layers)]
        if len(mlp_layer_types) != num_hidden_layers or not set(mlp_layer_types) <= {"dense", "sparse"}:
            raise ValueError(
                f"mlp_layer_types must give each of the {num_hidden_layers} layers 'dense' or 'sparse', got "
                f"{mlp_layer_types}"
            )
        _check_experts(num_experts_per_tok, num_experts)
        self.check_groups(num_experts, n_group, topk_group, num_experts_per_tok)
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
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.sliding_window_pattern = sliding_window_pattern
        self.layer_types = list(layer_types)
        self.mlp_layer_types = list(mlp_layer_types)
        self.first_k_dense_replace = first_k_dense_replace
        self.moe_intermediate_size = moe_intermediate_size
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.num_shared_experts = num_shared_experts
        self.norm_topk_prob = norm_topk_prob
        self.routed_scaling_factor = routed_scaling_factor
        self.n_group = n_group
        self.topk_group = topk_group
        self.output_router_logits = output_router_logits

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them, for the MLP kinds this config's layers have. q_norm / k_norm act on one head's `head_dim` and are
        replicated, as every norm and the router are; every routed expert's intermediate features are split (their
        sums all-reduced), the shared experts' as a dense MLP's."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        kinds = set(self.mlp_layer_types)
        mlp_styles = (("gate_proj", "colwise"), ("up_proj", "colwise"), ("down_proj", "rowwise"))
        if "sparse" in kinds:
            plan["layers.*.mlp.experts"] = "experts"
            plan.update({f"layers.*.mlp.shared_experts.{name}": style for name, style in mlp_styles})
        if "dense" in kinds:
            plan.update({f"layers.*.mlp.{name}": style for name, style in mlp_styles})
        return plan

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else it is a dense MLP): its `mlp_layer_types` entry."""
        return self.mlp_layer_types[layer_idx] == "sparse"


class ExaoneMoeRotaryEmbedding(Glm4MoeRotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (the whole head)."""

    def __init__(self, config: ExaoneMoeConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, head_dim(config), config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]


class ExaoneMoeMLP(Glm4MoeMLP):
    pass


class ExaoneMoeExperts(Glm4MoeExperts):
    pass


class ExaoneMoeTopkRouter(Glm4MoeTopkRouter):
    pass


class ExaoneMoeSparseMoEBlock(nn.Module):
    """The routed experts' weighted sum plus the shared experts' output. The router's correction bias is saved as
    upstream saves it, `e_score_correction_bias` beside the router (`gate.e_score_correction_bias` here)."""

    def __init__(self, config: ExaoneMoeConfig) -> None:
        super().__init__()
        self.experts = ExaoneMoeExperts(config)
        self.gate = ExaoneMoeTopkRouter(config)
        self.shared_experts = ExaoneMoeMLP(config, config.moe_intermediate_size * config.num_shared_experts)
        self.register_state_dict_post_hook(_bias_to_checkpoint)
        self.register_load_state_dict_pre_hook(_bias_from_checkpoint)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the MLP's output `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]` (float32)."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        routed = self.experts(tokens, top_k_index, top_k_weights).reshape(hidden_states.shape)
        return routed + self.shared_experts(hidden_states), router_logits


del Glm4MoeMoE


class ExaoneMoeDecoderLayer(Glm4MoeDecoderLayer):
    """Attention, then the routed and shared experts (returning the layer's router logits too) or, on the layers
    `mlp_layer_types` calls dense, a dense MLP (no router logits)."""

    def __init__(self, config: ExaoneMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = ExaoneMoeAttention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = ExaoneMoeSparseMoEBlock(config) if self.sparse else ExaoneMoeMLP(config)
        self.input_layernorm = ExaoneMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = ExaoneMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


def _bias_to_checkpoint(module: nn.Module, state_dict: dict[str, Any], prefix: str, metadata: Any) -> None:
    key = f"{prefix}gate.e_score_correction_bias"
    if key in state_dict:
        state_dict[f"{prefix}e_score_correction_bias"] = state_dict.pop(key)


def _bias_from_checkpoint(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    key = f"{prefix}e_score_correction_bias"
    if key in state_dict:
        state_dict[f"{prefix}gate.e_score_correction_bias"] = state_dict.pop(key)


class ExaoneMoeAttention(Glm4MoeAttention):
    """EXAONE 4.0's attention: Llama's without biases, an RMSNorm over each query and key head (`q_norm`, `k_norm`)
    before the rotary positions, which only sliding layers apply when the model has a `sliding_window`."""

    def __init__(self, config: ExaoneMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.use_rope = config.sliding_window is None or attention_type(config, layer_idx) == SLIDING_ATTENTION
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)
        self.q_norm = ExaoneMoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = ExaoneMoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)

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


class ExaoneMoeRMSNorm(Glm4MoeRMSNorm):
    pass


class ExaoneMoePreTrainedModel(Glm4MoePreTrainedModel):
    @property
    def _keys_to_ignore_on_load_unexpected(self) -> list[str]:
        """The checkpoint's multi-token-prediction weights, `mtp.*`, which decoding does not use (upstream ignores
        them too)."""
        return [r"^mtp\."]


class ExaoneMoeForCausalLM(Glm4MoeForCausalLM):
    pass
