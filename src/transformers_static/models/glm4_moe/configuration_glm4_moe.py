# Generated from modular_glm4_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""GLM-4.5 / GLM-4.6 (zai-org/GLM-4.5, GLM-4.5-Air, GLM-4.6): Qwen3-MoE's layers with DeepSeek-V3's router and
shared experts. A router scores every expert by the sigmoid of its logit (float32), chooses among the best
`topk_group` of `n_group` expert groups by those scores plus `e_score_correction_bias` (moe_utils.grouped_top_k),
and weighs the chosen experts by their unbiased scores (renormalised when `norm_topk_prob`, times
`routed_scaling_factor`); `n_shared_experts` always-on experts (one SwiGLU MLP of `n_shared_experts *
moe_intermediate_size`) add to every token. The first `first_k_dense_replace` layers keep a dense MLP. Attention:
q/k/v biases with `attention_bias` (never on o_proj), per-head q/k RMSNorms with `use_qk_norm`, and rotary positions
on the leading `partial_rotary_factor` share of each head (half by default; rotate-half pairs, not interleaved).

The experts are stacked (`mlp.experts.gate_up_proj` `[experts, 2 * moe_intermediate, hidden]`, `mlp.experts.down_proj`
`[experts, hidden, moe_intermediate]`) and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/
down_proj.weight`. The NextN (multi-token prediction) layers that published checkpoints append after the decoder,
`model.layers.{num_hidden_layers + i}` for `i < num_nextn_predict_layers`, are not used for decoding and are ignored
on load, as upstream ignores them (upstream's `generate(use_mtp=True)` is refused by GenerationConfig here).
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class Glm4MoeConfig(PretrainedConfig):
    """Upstream's fields and defaults (GLM-4.5-Air's sizes). `n_routed_experts` experts (alias `num_local_experts`)
    of width `moe_intermediate_size`, `num_experts_per_tok` per token from the best `topk_group` of `n_group`
    groups; layers from `first_k_dense_replace` on are sparse. The rotated share of each head lives, as upstream
    5.x keeps it, in `rope_parameters["partial_rotary_factor"]` (0.5 unless given there or at the top level).
    `num_nextn_predict_layers` (alias `num_mtp_layers`) counts the checkpoint's NextN layers, which are ignored.

    As upstream: `head_dim` is not a field (a config.json may hold one; else `hidden_size // num_attention_heads`),
    and there is no sliding window (a `sliding_window` or `layer_types` key, which upstream's model never reads, is
    dropped)."""

    model_type = "glm4_moe"
    attribute_map = {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"}

    def __init__(
        self,
        vocab_size: int = 151552,
        hidden_size: int = 4096,
        intermediate_size: int = 10944,
        num_hidden_layers: int = 46,
        num_attention_heads: int = 96,
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
        moe_intermediate_size: int = 1408,
        num_experts_per_tok: int = 8,
        output_router_logits: bool = False,
        n_shared_experts: int = 1,
        n_routed_experts: int = 128,
        routed_scaling_factor: float = 1.0,
        n_group: int = 1,
        topk_group: int = 1,
        first_k_dense_replace: int = 1,
        norm_topk_prob: bool = True,
        use_qk_norm: bool = False,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        num_nextn_predict_layers: int = 1,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        # upstream: the dict's own value wins over the top-level field, which defaults to a half
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.5))
        n_routed_experts = kwargs.pop("num_local_experts", n_routed_experts)
        num_nextn_predict_layers = kwargs.pop("num_mtp_layers", num_nextn_predict_layers)
        for unread in ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types"):
            kwargs.pop(unread, None)  # upstream's GLM-4.5 attends to every key of every layer
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
        if first_k_dense_replace < 0 or num_nextn_predict_layers < 0 or n_shared_experts < 0:
            raise ValueError(
                f"first_k_dense_replace ({first_k_dense_replace}), num_nextn_predict_layers "
                f"({num_nextn_predict_layers}) and n_shared_experts ({n_shared_experts}) must not be negative"
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
        self.first_k_dense_replace = first_k_dense_replace
        self.norm_topk_prob = norm_topk_prob
        self.use_qk_norm = use_qk_norm
        self.num_nextn_predict_layers = num_nextn_predict_layers
        factor = rope_parameters["partial_rotary_factor"]
        head = getattr(self, "head_dim", None) or hidden_size // num_attention_heads
        # upstream's frequencies are those of `int(head_dim * factor)` dims, rounded up to pairs (the default
        # sizes' 42-dim heads rotate 22 dims): what rotates is twice the frequencies, never more than a head
        rotary_ndims = 2 * ((int(head * factor) + 1) // 2)
        if not 0 < factor <= 1 or not 0 < rotary_ndims <= head:
            raise ValueError(
                f"partial_rotary_factor ({factor}) must lie in (0, 1] and rotate between one pair of dims and the "
                f"whole head: head_dim {head} rotates {rotary_ndims}"
            )

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


def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )
