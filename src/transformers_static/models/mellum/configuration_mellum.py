"""Mellum (JetBrains Mellum2) configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION


class MellumConfig(PretrainedConfig):
    """Qwen3-MoE's fields (`use_sliding_window`, `decoder_sparse_step` and `mlp_only_layers` dropped, as upstream)
    with sliding-window layers beside full ones (`layer_types`, default all full), each kind with its own rotary
    parameters (`rope_parameters` keyed by layer kind), and per layer a dense MLP of `intermediate_size` or a sparse
    one (`mlp_layer_types`, default all sparse). The experts are `num_local_experts` (read as `num_experts` too, as
    upstream saves them); `num_mtp_layers` is saved as `num_nextn_predict_layers`.

    The multi-token-prediction fields (`num_mtp_layers`, `mtp_layer_types`, `mtp_mlp_layer_types`) are accepted and
    kept: upstream builds no MTP layer either (its checkpoint weights, `mtp.*`, are ignored on load); more than one
    MTP layer is refused, as upstream refuses it. Refused by name too: a rotary type other than "default", a
    `partial_rotary_factor` below 1 (upstream's rotation takes whole heads), `rope_parameters` without an entry for a
    kind the layers use, lists of another length than `num_hidden_layers`."""

    model_type = "mellum"
    attribute_map = {"num_experts": "num_local_experts", "num_mtp_layers": "num_nextn_predict_layers"}

    def __init__(
        self,
        vocab_size: int = 98304,
        hidden_size: int = 2304,
        intermediate_size: int = 7168,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 32,
        num_key_value_heads: int = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        sliding_window: int | None = 1024,
        attention_dropout: float = 0.0,
        moe_intermediate_size: int = 896,
        num_experts_per_tok: int = 8,
        num_experts: int = 64,
        norm_topk_prob: bool = True,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        head_dim: int = 128,
        layer_types: list[str] | None = None,
        mlp_layer_types: list[str] | None = None,
        num_mtp_layers: int | None = None,
        mtp_layer_types: list[str] | None = None,
        mtp_mlp_layer_types: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        num_experts = kwargs.pop("num_local_experts", num_experts)
        num_mtp_layers = kwargs.pop("num_nextn_predict_layers", num_mtp_layers)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts}): "
                "each token is routed to that many experts"
            )
        if num_mtp_layers is not None and num_mtp_layers > 1:
            raise ValueError(f"Mellum supports a single MTP layer, but got num_mtp_layers={num_mtp_layers}")
        if layer_types is None:
            layer_types = [FULL_ATTENTION] * num_hidden_layers
        if mlp_layer_types is None:
            mlp_layer_types = ["sparse"] * num_hidden_layers
        for name, values, allowed in (
            ("layer_types", layer_types, {FULL_ATTENTION, SLIDING_ATTENTION}),
            ("mlp_layer_types", mlp_layer_types, {"dense", "sparse"}),
        ):
            if len(values) != num_hidden_layers or not set(values) <= allowed:
                raise ValueError(
                    f"{name} must give each of the {num_hidden_layers} layers a value of {sorted(allowed)}, got {values}"
                )
        if SLIDING_ATTENTION in layer_types and not sliding_window:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is {sliding_window}")
        if rope_parameters is None:
            rope_parameters = {
                FULL_ATTENTION: {"rope_type": "default", "rope_theta": 500000.0},
                SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 10000.0},
            }
        for kind in sorted(set(layer_types)):
            params = rope_parameters.get(kind)
            if not isinstance(params, dict):
                raise ValueError(
                    f"rope_parameters must hold an entry per layer kind ({kind!r} is missing), got {rope_parameters}"
                )
            if params.get("rope_type", "default") != "default":
                raise ValueError(
                    f"rope_parameters[{kind!r}] rope_type={params['rope_type']!r} is not supported for mellum: "
                    "only 'default' per-kind tables are"
                )
            if params.get("partial_rotary_factor", 1.0) != 1.0:
                raise ValueError(
                    f"rope_parameters[{kind!r}] partial_rotary_factor={params['partial_rotary_factor']} is not "
                    "supported for mellum: its attention rotates whole heads (upstream's tables would not fit)"
                )
        if num_mtp_layers:
            mtp_layer_types = mtp_layer_types or [SLIDING_ATTENTION] * num_mtp_layers
            mtp_mlp_layer_types = mtp_mlp_layer_types or ["sparse"] * num_mtp_layers
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
        self.sliding_window = sliding_window
        self.attention_dropout = attention_dropout
        self.moe_intermediate_size = moe_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.head_dim = head_dim
        self.layer_types = list(layer_types)
        self.mlp_layer_types = list(mlp_layer_types)
        self.num_nextn_predict_layers = num_mtp_layers
        self.mtp_layer_types = mtp_layer_types
        self.mtp_mlp_layer_types = mtp_mlp_layer_types

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them, for the MLP kinds this config's layers have (q_norm / k_norm act on one head and are replicated)."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        if "sparse" in self.mlp_layer_types:
            plan["layers.*.mlp.experts"] = "experts"
        if "dense" in self.mlp_layer_types:
            plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise"})
            plan["layers.*.mlp.down_proj"] = "rowwise"
        return plan
