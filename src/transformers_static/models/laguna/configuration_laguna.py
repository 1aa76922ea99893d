"""Laguna (poolside) configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION

_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION)


class LagunaConfig(PretrainedConfig):
    """Sliding-window layers beside full ones (`layer_types`, default all full), each kind with its own rotary
    parameters (`rope_parameters` keyed by layer kind: `rope_theta` and `partial_rotary_factor`, the share of each
    head rotated), a head count per layer (`num_attention_heads_per_layer`), a softplus output gate per head
    (`gating` True / "per-head") or per feature ("per-element"); per layer a dense MLP or a sparse one
    (`mlp_layer_types`, default dense first): a sigmoid router (logits soft-capped by `moe_router_logit_softcapping`
    when > 0) choosing by score plus `e_score_correction_bias`, weights renormalised, the routed sum times
    `moe_routed_scaling_factor`, plus a shared MLP of `shared_expert_intermediate_size`. The experts are
    `num_experts` (as upstream saves them), also read as `num_local_experts`.

    Refused by name: `moe_apply_router_weight_on_input` (as upstream refuses it), a rotary type other than "default"
    (upstream's per-kind tables take only it in full), `rope_parameters` without an entry for a kind the layers use,
    and lists of another length than `num_hidden_layers`."""

    model_type = "laguna"
    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 100352,
        hidden_size: int = 2048,
        intermediate_size: int = 8192,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 48,
        num_key_value_heads: int = 8,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        sliding_window: int | None = 512,
        attention_dropout: float = 0.0,
        moe_intermediate_size: int = 512,
        shared_expert_intermediate_size: int = 512,
        num_experts_per_tok: int = 8,
        num_experts: int = 256,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        head_dim: int = 128,
        attention_bias: bool = False,
        gating: bool | str = True,
        num_attention_heads_per_layer: list[int] | None = None,
        mlp_layer_types: list[str] | None = None,
        moe_routed_scaling_factor: float = 1.0,
        moe_apply_router_weight_on_input: bool = False,
        moe_router_logit_softcapping: float = 0.0,
        **kwargs: Any,
    ) -> None:
        num_experts = kwargs.pop("num_local_experts", num_experts)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if moe_apply_router_weight_on_input:
            raise ValueError(
                "moe_apply_router_weight_on_input=True is not supported: the routing weights scale the experts' "
                "outputs (upstream refuses it too)"
            )
        if layer_types is None:
            layer_types = [FULL_ATTENTION] * num_hidden_layers
        if mlp_layer_types is None:
            mlp_layer_types = ["dense"] + ["sparse"] * (num_hidden_layers - 1)
        if num_attention_heads_per_layer is None:
            num_attention_heads_per_layer = [num_attention_heads] * num_hidden_layers
        for name, values, allowed in (
            ("layer_types", layer_types, set(_KINDS)),
            ("mlp_layer_types", mlp_layer_types, {"dense", "sparse"}),
            ("num_attention_heads_per_layer", num_attention_heads_per_layer, None),
        ):
            if len(values) != num_hidden_layers or (allowed is not None and not set(values) <= allowed):
                raise ValueError(
                    f"{name} must give each of the {num_hidden_layers} layers a value"
                    + (f" of {sorted(allowed)}" if allowed else "")
                    + f", got {values}"
                )
        for heads in num_attention_heads_per_layer:
            if heads % num_key_value_heads:
                raise ValueError(
                    f"num_attention_heads_per_layer has {heads} heads, not divisible by num_key_value_heads "
                    f"({num_key_value_heads})"
                )
        if SLIDING_ATTENTION in layer_types and not sliding_window:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is {sliding_window}")
        if gating not in (True, False, "per-head", "per-element"):
            raise ValueError(f"gating must be True, 'per-head' or 'per-element', got {gating!r}")
        if rope_parameters is None:
            rope_parameters = {
                FULL_ATTENTION: {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
            }
        for kind in sorted(set(layer_types)):
            params = rope_parameters.get(kind)
            if not isinstance(params, dict):
                raise ValueError(
                    f"rope_parameters must hold an entry per layer kind ({kind!r} is missing), got {rope_parameters}"
                )
            if params.get("rope_type", "default") != "default":
                raise ValueError(
                    f"rope_parameters[{kind!r}] rope_type={params['rope_type']!r} is not supported for laguna: "
                    "only 'default' per-kind tables are"
                )
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts}): "
                "each token is routed to that many experts"
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
        self.sliding_window = sliding_window
        self.attention_dropout = attention_dropout
        self.moe_intermediate_size = moe_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.layer_types = list(layer_types)
        self.head_dim = head_dim
        self.attention_bias = attention_bias
        self.gating = gating
        self.num_attention_heads_per_layer = list(num_attention_heads_per_layer)
        self.mlp_layer_types = list(mlp_layer_types)
        self.moe_routed_scaling_factor = moe_routed_scaling_factor
        self.moe_apply_router_weight_on_input = moe_apply_router_weight_on_input
        self.moe_router_logit_softcapping = moe_router_logit_softcapping

    # No tensor-parallel plan (base_model_tp_plan None): the heads differ per layer and the gate is per head, which
    # the plan's one head split does not say; tensor_parallel refuses the model by name.
