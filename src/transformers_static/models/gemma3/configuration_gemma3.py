"""Gemma 3 (text only, model_type `gemma3_text`) configuration, with upstream's field names and defaults."""

from __future__ import annotations

import logging
from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters

logger = logging.getLogger(__name__)

# Rope bases when the config names none: global (full-attention) layers and local (sliding-window) layers.
DEFAULT_ROPE_THETA = {FULL_ATTENTION: 1_000_000.0, SLIDING_ATTENTION: 10_000.0}


class Gemma3TextConfig(PretrainedConfig):
    """Gemma 3's decoder: `sliding_window` layers and full layers in `layer_types` (by default five sliding then
    one full, `sliding_window_pattern` = 6, as the checkpoints' older field says), each kind with its own rotary
    parameters, `rope_parameters = {"sliding_attention": {...}, "full_attention": {...}}` (older config.json files
    give `rope_theta` for full layers, `rope_local_base_freq` for sliding ones and `rope_scaling` for full ones;
    they are read into that dict and saved as it, as upstream does), query/key RMSNorm, scores scaled by
    `query_pre_attn_scalar ** -0.5`, and optional final logit soft-capping.

    `attn_logit_softcapping` is stored but, as in upstream's Gemma 3, never applied (the model warns).
    `use_bidirectional_attention=True` is refused by the model: every mask here is causal.
    """

    model_type = "gemma3_text"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # The query/key norms act on each head with one weight: replicated, like every module not listed.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 262_208,
        hidden_size: int = 2304,
        intermediate_size: int = 9216,
        num_hidden_layers: int = 26,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 4,
        head_dim: int = 256,
        hidden_activation: str = "gelu_pytorch_tanh",
        max_position_embeddings: int = 131_072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 1,
        bos_token_id: int | None = 2,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        query_pre_attn_scalar: float = 256,
        sliding_window: int | None = 4096,
        layer_types: list[str] | None = None,
        final_logit_softcapping: float | None = None,
        attn_logit_softcapping: float | None = None,
        use_bidirectional_attention: bool | None = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = rope_parameters_by_kind(
            rope_parameters,
            rope_scaling=kwargs.pop("rope_scaling", None),
            rope_theta=kwargs.pop("rope_theta", None),
            rope_local_base_freq=kwargs.pop("rope_local_base_freq", None),
        )
        # Upstream keeps `sliding_window_pattern` (configs on the Hub still have it) as a field of its own.
        pattern = kwargs.get("sliding_window_pattern", 6)
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if hidden_size % num_attention_heads:  # upstream's check, although head_dim is a field of its own
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
            )
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        if layer_types is None:  # every `pattern`-th layer is full, the others slide
            layer_types = [
                FULL_ATTENTION if (i + 1) % pattern == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)
            ]
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_activation = hidden_activation
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.query_pre_attn_scalar = query_pre_attn_scalar
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)
        self.final_logit_softcapping = final_logit_softcapping
        self.attn_logit_softcapping = attn_logit_softcapping
        self.use_bidirectional_attention = use_bidirectional_attention


def rope_parameters_by_kind(
    rope_parameters: dict[str, Any] | None,
    *,
    rope_scaling: dict[str, Any] | None,
    rope_theta: float | None,
    rope_local_base_freq: float | None,
) -> dict[str, Any]:
    """`{"full_attention": {...}, "sliding_attention": {...}}` as upstream standardises it: the given dicts (missing
    or None: default rope), `rope_scaling` merged into the full layers' one, bases from `rope_theta` (full) and
    `rope_local_base_freq` (sliding) where a dict names none, else 1e6 and 1e4. Keys of a flat dict stay beside
    them, unread, as upstream leaves them."""
    by_kind = dict(rope_parameters or {})
    flat = sorted(set(by_kind) - {FULL_ATTENTION, SLIDING_ATTENTION})
    if flat:
        logger.warning(
            "Gemma 3 reads rope_parameters by layer kind (%r, %r): its keys %s are ignored, as upstream ignores them",
            FULL_ATTENTION,
            SLIDING_ATTENTION,
            flat,
        )
    full = dict(by_kind.get(FULL_ATTENTION) or {"rope_type": "default"})
    full.update(rope_scaling or {})
    by_kind[FULL_ATTENTION] = standardize_rope_parameters(
        full, rope_theta, None, default_theta=DEFAULT_ROPE_THETA[FULL_ATTENTION]
    )
    sliding = by_kind.get(SLIDING_ATTENTION) or {"rope_type": "default"}
    by_kind[SLIDING_ATTENTION] = standardize_rope_parameters(
        sliding, rope_local_base_freq, None, default_theta=DEFAULT_ROPE_THETA[SLIDING_ATTENTION]
    )
    return by_kind


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
