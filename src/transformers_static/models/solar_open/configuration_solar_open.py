# Generated from modular_solar_open.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Solar Open (upstage/Solar-Open-100B): GLM-4.5's sparse layers on Llama's attention. Every layer routes: a
router scores every expert by the sigmoid of its logit (float32), chooses among the best `topk_group` of `n_group`
expert groups by those scores plus `e_score_correction_bias` (moe_utils.grouped_top_k), and weighs the chosen experts
by their unbiased scores (renormalised when `norm_topk_prob`, times `routed_scaling_factor`); `n_shared_experts`
always-on experts (one SwiGLU MLP of `n_shared_experts * moe_intermediate_size`) add to every token. There are no
dense first layers, no q/k norms and no NextN layers. Attention: q/k/v biases with `attention_bias` (never on
o_proj), heads of `head_dim` (a field, 128 by default, so heads * head_dim need not be hidden_size), rotary
positions on the whole head.

The experts are stacked (`mlp.experts.gate_up_proj` `[experts, 2 * moe_intermediate, hidden]`, `mlp.experts.down_proj`
`[experts, hidden, moe_intermediate]`) and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/
down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class SolarOpenConfig(PretrainedConfig):
    """Upstream's fields and defaults (Solar-Open-100B's sizes). `n_routed_experts` experts (alias
    `num_local_experts`) of width `moe_intermediate_size`, `num_experts_per_tok` per token from the best
    `topk_group` of `n_group` groups, on every layer. Unlike GLM-4.5's config there is no `intermediate_size`,
    `first_k_dense_replace`, `use_qk_norm` or `num_nextn_predict_layers` field, and `head_dim` is one.

    Refused: a `partial_rotary_factor` other than 1 (in `rope_parameters` or at the top level). Upstream's rotary
    table then covers that share of each head, but its Llama attention rotates the whole head by it, which fails
    on the shapes: no upstream model runs with one."""

    model_type = "solar_open"
    attribute_map = {"num_local_experts": "n_routed_experts"}

    def __init__(
        self,
        vocab_size: int = 196608,
        hidden_size: int = 4096,
        num_hidden_layers: int = 48,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = 8,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        moe_intermediate_size: int = 1280,
        num_experts_per_tok: int = 8,
        output_router_logits: bool = False,
        n_shared_experts: int = 1,
        n_routed_experts: int = 128,
        routed_scaling_factor: float = 1.0,
        n_group: int = 1,
        topk_group: int = 1,
        norm_topk_prob: bool = True,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        head_dim: int = 128,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=1e6
        )
        if "partial_rotary_factor" in kwargs:  # upstream moves the top-level field into the rope parameters
            rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor"))
        factor = rope_parameters.get("partial_rotary_factor", 1.0)
        if factor != 1.0:
            raise ValueError(
                f"partial_rotary_factor={factor} is not supported: upstream's SolarOpen attention rotates the whole "
                "head (its rotary table of a partial share does not fit the heads, so no upstream model runs with one)"
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
        _check_experts(num_experts_per_tok, n_routed_experts)
        self.check_groups(n_routed_experts, n_group, topk_group, num_experts_per_tok)
        if n_shared_experts < 0:
            raise ValueError(f"n_shared_experts ({n_shared_experts}) must not be negative")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.moe_intermediate_size = moe_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.output_router_logits = output_router_logits
        self.n_shared_experts = n_shared_experts
        self.n_routed_experts = n_routed_experts
        self.routed_scaling_factor = routed_scaling_factor
        self.n_group = n_group
        self.topk_group = topk_group
        self.norm_topk_prob = norm_topk_prob
        self.head_dim = head_dim

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): heads split, every routed expert's intermediate
        features split (their sums all-reduced), the shared experts' as a dense MLP's; norms and routers
        replicated."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.mlp.experts": "experts",
        }
        if self.n_shared_experts:
            for name, style in (("gate_proj", "colwise"), ("up_proj", "colwise"), ("down_proj", "rowwise")):
                plan[f"layers.*.mlp.shared_experts.{name}"] = style
        return plan

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Every layer routes to experts."""
        return True

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


def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )
