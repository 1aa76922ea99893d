# Generated from modular_qwen2_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (biases on q/k/v with `qkv_bias`, none on
o_proj; no q/k norms) with Qwen3-MoE's sparse MLP layers plus a shared expert: every token also runs one SwiGLU MLP
of width `shared_expert_intermediate_size`, scaled by `sigmoid(shared_expert_gate(x))` (one logit per token), added
to the routed experts' weighted sum. The router is a softmax over all experts, top-k, renormalised only with
`norm_topk_prob`. Layers in `mlp_only_layers`, or off the `decoder_sparse_step` interval, keep a dense MLP.

Sliding windows as upstream 5.23 derives them: with `use_sliding_window`, the even layers (0, 2, ...) below
`max_window_layers` are windowed, the others full (or as `layer_types` lists them).

The experts are stacked parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class Qwen2MoeConfig(PretrainedConfig):
    """Qwen2's attention fields (`qkv_bias`, `max_window_layers`, `layer_types`) and Qwen3-MoE's expert fields, plus
    `shared_expert_intermediate_size` (the shared expert's width). A layer is sparse when it is not in
    `mlp_only_layers` and `(layer + 1) % decoder_sparse_step == 0` (and there are experts).

    As upstream 5.23: `head_dim` is not a field (a config.json may hold one); without `use_sliding_window` the
    `sliding_window` is 0; `layer_types`, unless listed, makes layer i sliding when `use_sliding_window`, i is even
    and `i < max_window_layers`. A sliding layer without a positive window is refused. The experts are `num_experts` (as upstream
    saves them), also read as `num_local_experts`."""

    model_type = "qwen2_moe"
    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 2048,
        intermediate_size: int = 5632,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 16,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        use_sliding_window: bool = False,
        sliding_window: int | None = 4096,
        max_window_layers: int = 28,
        attention_dropout: float = 0.0,
        decoder_sparse_step: int = 1,
        moe_intermediate_size: int = 1408,
        shared_expert_intermediate_size: int = 5632,
        num_experts_per_tok: int = 4,
        num_experts: int = 60,
        norm_topk_prob: bool = False,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        mlp_only_layers: list[int] | None = None,
        qkv_bias: bool = True,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
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
        if num_experts > 0:
            _check_experts(num_experts_per_tok, num_experts)
        if decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be a positive layer interval, got {decoder_sparse_step}")
        sliding_window = sliding_window if use_sliding_window else 0
        if layer_types is None:
            layer_types = [
                SLIDING_ATTENTION if use_sliding_window and i % 2 == 0 and i < max_window_layers else FULL_ATTENTION
                for i in range(num_hidden_layers)
            ]
        self._check_layer_types(layer_types, num_hidden_layers, sliding_window)
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
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.attention_dropout = attention_dropout
        self.decoder_sparse_step = decoder_sparse_step
        self.moe_intermediate_size = moe_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.mlp_only_layers = [] if mlp_only_layers is None else list(mlp_only_layers)
        self.qkv_bias = qkv_bias
        self.layer_types = list(layer_types)

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them, for the MLP kinds this config's layers have. Every expert's intermediate features are split (the
        routing is replicated), the experts' sums all-reduced; the shared expert is split as a dense MLP (its gate,
        one logit per token, replicated)."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        sparse = {self.is_sparse_layer(i) for i in range(self.num_hidden_layers)}
        if True in sparse:
            plan["layers.*.mlp.experts"] = "experts"
            plan["layers.*.mlp.shared_expert.gate_proj"] = "colwise"
            plan["layers.*.mlp.shared_expert.up_proj"] = "colwise"
            plan["layers.*.mlp.shared_expert.down_proj"] = "rowwise"
        if False in sparse:
            plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise"})
            plan["layers.*.mlp.down_proj"] = "rowwise"
        return plan

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else it is a dense MLP), as upstream decides."""
        return (
            layer_idx not in self.mlp_only_layers
            and self.num_local_experts > 0
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @staticmethod
    def _check_layer_types(layer_types: list[str], num_hidden_layers: int, sliding_window: int | None) -> None:
        """One known kind per layer, and a positive window for the sliding ones (upstream would build a mask of
        nothing from a window of 0, which it sets without `use_sliding_window`)."""
        if len(layer_types) != num_hidden_layers:
            raise ValueError(
                f"layer_types must list one kind per layer ({num_hidden_layers}), got {len(layer_types)}: {layer_types}"
            )
        unknown = sorted(set(layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION})
        if unknown:
            raise ValueError(f"layer_types may only hold {FULL_ATTENTION!r} and {SLIDING_ATTENTION!r}, got {unknown}")
        if SLIDING_ATTENTION in layer_types and not (sliding_window or 0) > 0:
            raise ValueError(
                f"layer_types has sliding_attention layers but sliding_window is {sliding_window!r} "
                "(set use_sliding_window=True and sliding_window to a positive number of keys)"
            )


def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )
