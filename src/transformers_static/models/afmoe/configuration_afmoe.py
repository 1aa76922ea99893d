"""AFMoE (Arcee's Trinity) configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class AfmoeConfig(PretrainedConfig):
    """Sliding-window layers beside full ones (`layer_types`; by default every `global_attn_every_n_layers`-th layer
    is full, the others slide over `sliding_window` keys), the first `num_dense_layers` layers a dense MLP of
    `intermediate_size`, the others `num_experts` experts of width `moe_intermediate_size` (`num_experts_per_tok`
    per token, by sigmoid score plus the `expert_bias`, weights renormalised and times `route_scale`) beside a shared
    MLP of width `moe_intermediate_size * num_shared_experts`. `mup_enabled` scales the input embeddings by
    `sqrt(hidden_size)`. The experts are `num_experts` (as upstream saves them), also read as `num_local_experts`.

    Refused by name (upstream would fail or silently differ): a sliding layer without a window, a `layer_types` of
    another length or kind, a `partial_rotary_factor` below 1 (upstream's rotary tables would not fit its heads)."""

    model_type = "afmoe"
    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 200192,
        hidden_size: int = 2048,
        intermediate_size: int = 6144,
        moe_intermediate_size: int = 1408,
        num_hidden_layers: int = 32,
        num_dense_layers: int = 1,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 16384,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        num_experts: int = 64,
        num_experts_per_tok: int = 6,
        num_shared_experts: int = 2,
        route_scale: float = 1.0,
        output_router_logits: bool = False,
        global_attn_every_n_layers: int = 4,
        sliding_window: int | None = 1024,
        layer_types: list[str] | None = None,
        attention_dropout: float = 0.0,
        mup_enabled: bool = False,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        attention_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        num_experts = kwargs.pop("num_local_experts", num_experts)
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
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts}): "
                "each token is routed to that many experts"
            )
        if num_shared_experts < 0 or num_dense_layers < 0:
            raise ValueError(
                f"num_shared_experts ({num_shared_experts}) and num_dense_layers ({num_dense_layers}) must be >= 0"
            )
        if rope_parameters.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(
                f"partial_rotary_factor={rope_parameters['partial_rotary_factor']} is not supported for afmoe: its "
                "sliding layers rotate every dimension of a head (upstream's tables would not fit the heads)"
            )
        if layer_types is None:  # every global_attn_every_n_layers-th layer is full, the others slide
            layer_types = [
                SLIDING_ATTENTION if (i + 1) % global_attn_every_n_layers else FULL_ATTENTION
                for i in range(num_hidden_layers)
            ]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and not sliding_window:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is {sliding_window}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_dense_layers = num_dense_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.num_shared_experts = num_shared_experts
        self.route_scale = route_scale
        self.output_router_logits = output_router_logits
        self.global_attn_every_n_layers = global_attn_every_n_layers
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)
        self.attention_dropout = attention_dropout
        self.mup_enabled = mup_enabled
        self.attention_bias = attention_bias

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them. The output gate `gate_proj` has one feature per query feature and is split with the query heads;
        q_norm / k_norm act on one head and are replicated; every expert's intermediate features are split (the
        routing and `expert_bias` replicated), the shared experts and the dense MLPs as every MLP."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.gate_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        if self.num_dense_layers < self.num_hidden_layers:
            plan["layers.*.mlp.experts"] = "experts"
            plan["layers.*.mlp.shared_experts.gate_proj"] = "colwise"
            plan["layers.*.mlp.shared_experts.up_proj"] = "colwise"
            plan["layers.*.mlp.shared_experts.down_proj"] = "rowwise"
        if self.num_dense_layers > 0:
            plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise"})
            plan["layers.*.mlp.down_proj"] = "rowwise"
        return plan
