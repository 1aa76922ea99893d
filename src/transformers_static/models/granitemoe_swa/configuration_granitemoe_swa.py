# Generated from modular_granitemoe_swa.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""GraniteMoeSWA: GraniteMoeShared (Granite's four multipliers; top-k of the router logits, a softmax over the
chosen; a shared MLP beside the experts when `shared_intermediate_size` is not 0, upstream's default being 0) with
GraniteSWA's attention: sliding-window layers beside full ones (`config.layer_types`, one mask per kind made once per
forward), a learned sink logit per head in every attention layer (`sinks`: one more column in each query's softmax,
dropped after it; upstream writes it as the output scaled by `sigmoid(logsumexp(scores) - sink)`, the same thing),
and a rotary base per layer (`config.layer_rope_theta`; 0: that layer has no position encoding).

The sinks need the eager kernel (sdpa has no column to add): sdpa is refused, as upstream refuses it. A single 4D
`attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind its own 4D
mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class GraniteMoeSWAConfig(PretrainedConfig):
    """GraniteMoeShared's fields plus GraniteSWA's: `sliding_window` (128), `layer_types` (one of
    "full_attention" / "sliding_attention" per layer; by default every fourth layer is full, starting with the first)
    and `layer_rope_theta` (each layer's rotary base; 0: no position encoding in that layer; by default
    `rope_parameters["rope_theta"]` everywhere). Every attention layer has learned sinks, which need the eager
    kernel: it is the default and sdpa is refused, as upstream."""

    model_type = "granitemoe_swa"

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them. Each rank holds its query heads' sinks; every expert's intermediate features are split (the routing is
        replicated), the experts' sums all-reduced; the shared MLP's gate and up halves each split evenly, its output
        projection by rows."""
        plan = {
            "layers.*.self_attn": "sinks",
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.block_sparse_moe.experts": "experts",
        }
        if self.shared_intermediate_size:  # a plan entry must name modules that exist
            plan["layers.*.shared_mlp.input_linear"] = "colwise_gate_up"
            plan["layers.*.shared_mlp.output_linear"] = "rowwise"
        return plan

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        residual_multiplier: float = 1.0,
        attention_multiplier: float = 1.0,
        num_local_experts: int = 8,
        num_experts_per_tok: int = 2,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        shared_intermediate_size: int = 0,
        sliding_window: int | None = 128,
        layer_types: list[str] | None = None,
        layer_rope_theta: list[float] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        kwargs.setdefault("attn_implementation", "eager")
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
        if not 0 < num_experts_per_tok <= num_local_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
                f"({num_local_experts}): each token is routed to that many experts"
            )
        if shared_intermediate_size < 0:
            raise ValueError(
                f"shared_intermediate_size must be 0 (no shared MLP) or a positive width, got {shared_intermediate_size}"
            )
        if layer_types is None:  # every fourth layer is full, from the first on; the others slide
            layer_types = [FULL_ATTENTION if i % 4 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is None")
        if layer_rope_theta is None:
            layer_rope_theta = [rope_parameters["rope_theta"]] * num_hidden_layers
        if len(layer_rope_theta) != num_hidden_layers or any(theta < 0 for theta in layer_rope_theta):
            raise ValueError(
                f"layer_rope_theta must give each of the {num_hidden_layers} layers a rotary base (0: no position "
                f"encoding), got {layer_rope_theta}"
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
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.residual_multiplier = residual_multiplier
        self.attention_multiplier = attention_multiplier
        self.num_local_experts = num_local_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.shared_intermediate_size = shared_intermediate_size
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)
        self.layer_rope_theta = list(layer_rope_theta)

    @property
    def head_dim(self) -> int:
        """`hidden_size // num_attention_heads`, unless the config sets a `head_dim` (upstream has no such field but
        its attention and rotary read one when config.json holds it; it is saved only when set)."""
        return self.__dict__.get("head_dim") or self.hidden_size // self.num_attention_heads

    @head_dim.setter
    def head_dim(self, value: int | None) -> None:
        self.__dict__["head_dim"] = value
