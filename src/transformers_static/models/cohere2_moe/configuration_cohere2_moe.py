# Generated from modular_cohere2_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Cohere2-MoE: Cohere2's layers (attention and MLP in parallel off one norm, sliding-window layers with interleaved
rotary positions beside global layers without positions, logits times `logit_scale`) with sparse MLPs: a router
takes each token's `num_experts_per_tok` largest logits and weighs their experts by a softmax over those logits
(`expert_selection_fn="softmax"`) or by their sigmoids (`"sigmoid"`, renormalised when `norm_topk_prob`);
`num_shared_experts` always-on experts (one SwiGLU MLP of `num_shared_experts * intermediate_size`) are summed
with the routed output or averaged with it (`shared_expert_combination_strategy`). Layers listed "dense" in
`mlp_layer_types` (the first `first_k_dense_replace`, when a config gives that) keep a dense MLP of
`prefix_dense_intermediate_size`; with `prefix_dense_sliding_window_pattern == 1` they are global layers that
rotate anyway. The norms are RMSNorms when `rms_norm_eps` is set, else Cohere's bias-free LayerNorms.

The experts are stacked and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class Cohere2MoeConfig(PretrainedConfig):
    """Upstream's fields and defaults. `num_experts` routed experts of width `intermediate_size`, `num_experts_per_tok`
    per token. `layer_types` is derived, as upstream, unless given: the first `first_k_dense_replace` layers (a
    config key, not kept) sliding unless every `prefix_dense_sliding_window_pattern`-th, the others unless every
    `sliding_window_pattern`-th; `mlp_layer_types` ("dense" / "sparse" per layer) likewise from
    `first_k_dense_replace`. `head_dim` is a field (128 by default, as upstream)."""

    model_type = "cohere2_moe"

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism: heads split; every routed expert's intermediate features split (their sums
        all-reduced), the dense layers' and shared experts' MLPs as every MLP; norms and routers replicated."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        mlps = []
        if "sparse" in self.mlp_layer_types:
            plan["layers.*.mlp.experts"] = "experts"
            if self.num_shared_experts:
                mlps.append("layers.*.mlp.shared_experts")
        if "dense" in self.mlp_layer_types:
            mlps.append("layers.*.mlp")
        for mlp in mlps:
            for name, style in (("gate_proj", "colwise"), ("up_proj", "colwise"), ("down_proj", "rowwise")):
                plan[f"{mlp}.{name}"] = style
        return plan

    def __init__(
        self,
        vocab_size: int = 256000,
        hidden_size: int = 8192,
        intermediate_size: int = 22528,
        logit_scale: float = 0.0625,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = None,
        head_dim: int = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 5,
        eos_token_id: int | list[int] | None = 255001,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        sliding_window: int | None = 4096,
        num_experts_per_tok: int = 2,
        num_experts: int = 8,
        output_router_logits: bool = False,
        num_shared_experts: int = 0,
        shared_expert_combination_strategy: str = "average",
        expert_selection_fn: str = "softmax",
        layer_types: list[str] | None = None,
        mlp_layer_types: list[str] | None = None,
        prefix_dense_sliding_window_pattern: int = 1,
        norm_topk_prob: bool = True,
        prefix_dense_intermediate_size: int | None = None,
        rms_norm_eps: float | None = None,
        sliding_window_pattern: int = 4,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        first_k_dense_replace = kwargs.pop("first_k_dense_replace", 0)
        if layer_types is None:
            prefix = [
                SLIDING_ATTENTION if (i + 1) % prefix_dense_sliding_window_pattern else FULL_ATTENTION
                for i in range(first_k_dense_replace)
            ]
            rest = [
                SLIDING_ATTENTION if (i + 1) % sliding_window_pattern else FULL_ATTENTION
                for i in range(num_hidden_layers - first_k_dense_replace)
            ]
            layer_types = prefix + rest
        if mlp_layer_types is None:
            mlp_layer_types = ["dense" if i < first_k_dense_replace else "sparse" for i in range(num_hidden_layers)]
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
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        if len(mlp_layer_types) != num_hidden_layers or not set(mlp_layer_types) <= {"dense", "sparse"}:
            raise ValueError(
                f"mlp_layer_types must list 'dense' or 'sparse' for each of the {num_hidden_layers} layers, got {mlp_layer_types}"
            )
        if expert_selection_fn not in ("softmax", "sigmoid"):
            raise ValueError(
                f"expert_selection_fn must be one of {('softmax', 'sigmoid')}, got {expert_selection_fn!r}"
            )
        if num_shared_experts > 0 and shared_expert_combination_strategy not in ("average", "sum"):
            raise ValueError(
                f"shared_expert_combination_strategy must be one of {('average', 'sum')}, got "
                f"{shared_expert_combination_strategy!r}"
            )
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.logit_scale = logit_scale
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.output_router_logits = output_router_logits
        self.num_shared_experts = num_shared_experts
        self.shared_expert_combination_strategy = shared_expert_combination_strategy
        self.expert_selection_fn = expert_selection_fn
        self.layer_types = list(layer_types)
        self.mlp_layer_types = list(mlp_layer_types)
        self.prefix_dense_sliding_window_pattern = prefix_dense_sliding_window_pattern
        self.norm_topk_prob = norm_topk_prob
        self.prefix_dense_intermediate_size = prefix_dense_intermediate_size
        self.rms_norm_eps = rms_norm_eps
        self.sliding_window_pattern = sliding_window_pattern

    @property
    def num_local_experts(self) -> int:
        """The routed experts' count, under the name MoeCausalLMMixin reads."""
        return self.num_experts


def _check_layer_types(layer_types: list[str], num_hidden_layers: int, sliding_window: int | None) -> None:
    """One known kind per layer, and a window for the sliding ones."""
    if len(layer_types) != num_hidden_layers:
        raise ValueError(
            f"layer_types must list one kind per layer ({num_hidden_layers}), got {len(layer_types)}: {layer_types}"
        )
    unknown = sorted(set(layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION})
    if unknown:
        raise ValueError(f"layer_types may hold {FULL_ATTENTION!r} or {SLIDING_ATTENTION!r}, got {unknown}")
    if SLIDING_ATTENTION in layer_types and sliding_window is None:
        raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is None")
