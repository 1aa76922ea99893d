# Generated from modular_dots1.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""dots.llm1 (rednote-hilab/dots.llm1.base, .inst): GLM-4.5's sparse layers (DeepSeek-V3's sigmoid router, grouped
choice with `e_score_correction_bias`, shared experts, dense first layers) on Qwen3's attention: per-head q/k
RMSNorms on every layer, `attention_bias` on all four projections, rotary positions on the whole head, and sliding
windows on the layers at or beyond `max_window_layers` (or as `layer_types` lists them).

The experts are stacked and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class Dots1Config(PretrainedConfig):
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

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them, for the MLP kinds this config's layers have (a plan entry must name modules that exist). q_norm /
        k_norm act on one head's `head_dim` and are replicated, as every norm and the router are; every routed
        expert's intermediate features are split (their sums all-reduced), the shared experts' as a dense MLP's."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        if self.num_hidden_layers > self.first_k_dense_replace:
            plan["layers.*.mlp.experts"] = "experts"
            if self.n_shared_experts:
                for name, style in (("gate_proj", "colwise"), ("up_proj", "colwise"), ("down_proj", "rowwise")):
                    plan[f"layers.*.mlp.shared_experts.{name}"] = style
        if self.first_k_dense_replace:
            plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise"})
            plan["layers.*.mlp.down_proj"] = "rowwise"
        return plan

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else it is a dense MLP): from `first_k_dense_replace` on."""
        return layer_idx >= self.first_k_dense_replace

    @staticmethod
    def check_groups(n_routed_experts: int, n_group: int, topk_group: int, num_experts_per_tok: int) -> None:
        """Upstream's router scores each group by its best two experts and keeps `topk_group` of them, which must
        hold `num_experts_per_tok` experts: groups of at least two experts that split the experts evenly."""
        if n_group < 1 or n_routed_experts % n_group or n_routed_experts // n_group < 2:
            raise ValueError(
                f"n_group ({n_group}) must split the n_routed_experts ({n_routed_experts}) into equal groups of at "
                "least two experts (each group is scored by its best two)"
            )
        if not 1 <= topk_group <= n_group:
            raise ValueError(f"topk_group ({topk_group}) must be between 1 and n_group ({n_group})")
        if num_experts_per_tok > topk_group * (n_routed_experts // n_group):
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) exceeds the {topk_group * (n_routed_experts // n_group)}"
                f" experts that topk_group={topk_group} of n_group={n_group} groups hold"
            )

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


def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )
