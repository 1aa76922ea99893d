"""gpt-oss configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters

DEFAULT_THETA = 150000.0
# upstream's rope_parameters when none are given: YaRN stretching a 4096-position pretraining 32 times
DEFAULT_YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


class GptOssConfig(PretrainedConfig):
    """Attention with learned per-head sinks, sliding-window layers alternating with full ones (`layer_types`,
    default: even layers sliding), biases on the four attention projections (`attention_bias`), YaRN rotary
    positions; a sparse MLP of `num_local_experts` experts (alias `num_experts`) with biases and a clamped SwiGLU
    (`swiglu_alpha`, `swiglu_limit`), `num_experts_per_tok` per token (softmax over the chosen router logits).

    `hidden_act` is kept for upstream's sake; the experts' activation is always the clamped SwiGLU. The sinks need
    the eager kernel, which is this model's default: sdpa is refused."""

    model_type = "gpt_oss"
    attribute_map = {"num_experts": "num_local_experts"}
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # Each rank holds its query heads' sinks; every expert's intermediate features are split (the routing is
    # replicated), the experts' sums all-reduced.
    base_model_tp_plan = {
        "layers.*.self_attn": "sinks",
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.experts": "experts",
    }

    def __init__(
        self,
        num_hidden_layers: int = 36,
        num_local_experts: int = 128,
        vocab_size: int = 201088,
        hidden_size: int = 2880,
        intermediate_size: int = 2880,
        head_dim: int | None = 64,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = 8,
        sliding_window: int | None = 128,
        tie_word_embeddings: bool = False,
        hidden_act: str = "silu",
        initializer_range: float = 0.02,
        max_position_embeddings: int = 131072,
        rms_norm_eps: float = 1e-5,
        rope_parameters: dict[str, Any] | None = None,
        attention_dropout: float = 0.0,
        num_experts_per_tok: int = 4,
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
        router_aux_loss_coef: float = 0.001,
        output_router_logits: bool = False,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        attention_bias: bool = True,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_gpt_oss_rope(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), max_position_embeddings
        )
        num_local_experts = kwargs.pop("num_experts", num_local_experts)
        kwargs.setdefault("attn_implementation", "eager")
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
        _check_experts(num_experts_per_tok, num_local_experts)
        if layer_types is None:
            layer_types = [SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(num_hidden_layers)]
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        self.num_hidden_layers = num_hidden_layers
        self.num_local_experts = num_local_experts
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.sliding_window = sliding_window
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_dropout = attention_dropout
        self.num_experts_per_tok = num_experts_per_tok
        self.swiglu_alpha = swiglu_alpha
        self.swiglu_limit = swiglu_limit
        self.router_aux_loss_coef = router_aux_loss_coef
        self.output_router_logits = output_router_logits
        self.layer_types = list(layer_types)
        self.attention_bias = attention_bias


def standardize_gpt_oss_rope(
    rope_parameters: dict[str, Any] | None,
    rope_theta: float | None,
    rope_scaling: dict[str, Any] | None,
    max_position_embeddings: int,
) -> dict[str, Any]:
    """Upstream's `rope_parameters`: the given dict (or the older `rope_scaling` + `rope_theta`), by default YaRN
    (`DEFAULT_YARN`); a YaRN dict gets `rope_theta` (default 150000) and `original_max_position_embeddings`
    (default `max_position_embeddings`) when it lacks them, and must state its `factor`. Other types are read as
    every model reads them."""
    params = dict(rope_parameters or rope_scaling or DEFAULT_YARN)
    if "type" in params:  # the oldest checkpoints spell rope_type this way
        params.setdefault("rope_type", params.pop("type"))
    if params.get("rope_type", "default") != "yarn":
        return standardize_rope_parameters(params, rope_theta, None, default_theta=DEFAULT_THETA)
    params.setdefault("rope_theta", rope_theta if rope_theta is not None else DEFAULT_THETA)
    params.setdefault("original_max_position_embeddings", max_position_embeddings)
    if "factor" not in params:
        raise ValueError(f"rope_parameters of rope_type 'yarn' must hold a 'factor', got {params}")
    return params


# Copied from transformers_static.models.mixtral.configuration_mixtral._check_experts
def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )


# Copied from transformers_static.models.gemma2.configuration_gemma2._check_layer_types
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
