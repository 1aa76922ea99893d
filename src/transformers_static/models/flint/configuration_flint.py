"""Flint configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class FlintConfig(PretrainedConfig):
    """Qwen2-MoE's fields (`use_sliding_window`, `max_window_layers` and `qkv_bias` dropped, as upstream) plus
    `head_dim` and `attention_bias`: sliding-window layers beside full ones (`layer_types`; by default full on the
    first two layers, every fourth layer from layer 1 and the last, sliding elsewhere), the full layers without
    position encoding; learned attention sinks (eager only: sdpa is refused, as upstream); sparse layers where
    not in `mlp_only_layers` (default [0, 1]) and on the `decoder_sparse_step` interval: a sigmoid router (float32)
    renormalised with `norm_topk_prob`, plus an ungated shared expert of `shared_expert_intermediate_size`. The
    experts are `num_experts` (as upstream saves them), also read as `num_local_experts`.

    Refused by name: a `partial_rotary_factor` below 1 (upstream's tables would not fit its heads), a sliding layer
    without a window, a `layer_types` of another length or kind."""

    model_type = "flint"
    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 150144,
        hidden_size: int = 2048,
        intermediate_size: int = 6144,
        num_hidden_layers: int = 49,
        num_attention_heads: int = 32,
        num_key_value_heads: int = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 262144,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        sliding_window: int | None = 513,
        attention_dropout: float = 0.0,
        decoder_sparse_step: int = 1,
        moe_intermediate_size: int = 512,
        shared_expert_intermediate_size: int = 1024,
        num_experts_per_tok: int = 6,
        num_experts: int = 256,
        norm_topk_prob: bool = True,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.0005,
        mlp_only_layers: list[int] | None = None,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        head_dim: int = 128,
        attention_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        num_experts = kwargs.pop("num_local_experts", num_experts)
        kwargs.setdefault("attn_implementation", "eager")
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
        if num_experts > 0 and not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts}): "
                "each token is routed to that many experts"
            )
        if decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be a positive layer interval, got {decoder_sparse_step}")
        if rope_parameters.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(
                f"partial_rotary_factor={rope_parameters['partial_rotary_factor']} is not supported for flint: its "
                "sliding layers rotate every dimension of a head (upstream's tables would not fit the heads)"
            )
        if layer_types is None:
            layer_types = [
                FULL_ATTENTION if i < 2 or i % 4 == 1 or i == num_hidden_layers - 1 else SLIDING_ATTENTION
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
        self.decoder_sparse_step = decoder_sparse_step
        self.moe_intermediate_size = moe_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.mlp_only_layers = [0, 1] if mlp_only_layers is None else list(mlp_only_layers)
        self.layer_types = list(layer_types)
        self.head_dim = head_dim
        self.attention_bias = attention_bias

    # No tensor-parallel plan (base_model_tp_plan None): upstream replicates the attention (its sinks are not split
    # with the heads), which the plan here cannot say; tensor_parallel refuses the model by name.

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else it is a dense MLP), as upstream decides."""
        return (
            layer_idx not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )
