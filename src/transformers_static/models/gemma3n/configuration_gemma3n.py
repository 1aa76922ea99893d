"""Gemma 3n (text only, model_type `gemma3n_text`) configuration, with upstream's field names and defaults."""

from __future__ import annotations

import logging
from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters

logger = logging.getLogger(__name__)

# Rope bases when the config names none: global (full-attention) layers and local (sliding-window) layers.
DEFAULT_ROPE_THETA = {FULL_ATTENTION: 1_000_000.0, SLIDING_ATTENTION: 10_000.0}


class Gemma3nTextConfig(PretrainedConfig):
    """Gemma 3n's decoder: Gemma 3's sliding/full layers (`layer_types`, four sliding then one full by default), each
    kind with its rotary parameters (`rope_parameters = {"sliding_attention": {...}, "full_attention": {...}}`, or
    the older `rope_theta` / `rope_local_base_freq` / `rope_scaling`), query/key/value RMSNorm, scores unscaled, and:

    - AltUp: `altup_num_inputs` streams of the hidden state, the `altup_active_idx` one run through each layer, the
      others predicted and corrected from it (`altup_correct_scale`: the corrected active stream scaled before it
      feeds the per-layer input gate; `altup_coef_clip`: the coefficients' clamp, applied while training only, as
      upstream);
    - Laurel: a low-rank (`laurel_rank`) residual beside attention;
    - per-layer input embeddings (`vocab_size_per_layer_input` tokens, `hidden_size_per_layer_input` per layer);
    - key/value sharing: the last `num_kv_shared_layers` layers attend the keys/values of the last earlier layer of
      their kind (`kv_sharing_modes`);
    - activation sparsity: per layer (`activation_sparsity_pattern`), the MLP's gate activations below
      `mean + std * Phi^-1(sparsity)` are zeroed (a Gaussian top-k; 0.0: dense);
    - `intermediate_size` per layer (one value is repeated, as upstream stores it), final logit soft-capping.
    """

    model_type = "gemma3n_text"
    # No tensor-parallel plan (upstream has one): the Gaussian top-k takes each token's mean and std over the whole
    # MLP width, which a column split of gate_proj would cut per rank; `tp_plan="auto"` is refused by name.

    def __init__(
        self,
        vocab_size: int = 262_400,
        hidden_size: int = 2048,
        intermediate_size: int | list[int] = 16_384,
        num_hidden_layers: int = 35,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 2,
        head_dim: int = 256,
        hidden_activation: str = "gelu_pytorch_tanh",
        max_position_embeddings: int = 32_768,
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
        sliding_window: int = 512,
        layer_types: list[str] | None = None,
        final_logit_softcapping: float | None = 30.0,
        vocab_size_per_layer_input: int = 262_144,
        hidden_size_per_layer_input: int = 256,
        altup_active_idx: int = 0,
        altup_coef_clip: float | None = 120.0,
        altup_correct_scale: bool = True,
        altup_num_inputs: int = 4,
        num_kv_shared_layers: int = 15,
        laurel_rank: int = 64,
        activation_sparsity_pattern: list[float] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = rope_parameters_by_kind(
            rope_parameters,
            rope_scaling=kwargs.pop("rope_scaling", None),
            rope_theta=kwargs.pop("rope_theta", None),
            rope_local_base_freq=kwargs.pop("rope_local_base_freq", None),
        )
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
        if isinstance(intermediate_size, (list, tuple)):
            if len(intermediate_size) != num_hidden_layers:
                raise ValueError(
                    "intermediate_size must have an explicit intermediate size for every layer or one for all "
                    f"layers. Expected {num_hidden_layers} values but got {len(intermediate_size)}."
                )
            intermediate_size = list(intermediate_size)
        else:
            intermediate_size = [intermediate_size] * num_hidden_layers
        if layer_types is None:  # every fifth layer is full, the others slide
            layer_types = [FULL_ATTENTION if (i + 1) % 5 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        if activation_sparsity_pattern is None:  # upstream's default: the first 10 layers of a deeper model sparse
            sparse = 10 if num_hidden_layers > 10 else 0
            activation_sparsity_pattern = [0.95] * sparse + [0.0] * (num_hidden_layers - sparse)
        if not isinstance(activation_sparsity_pattern, (list, tuple)):
            raise ValueError(
                "activation_sparsity_pattern must list one sparsity per layer (upstream reads it per layer), got "
                f"{activation_sparsity_pattern!r}"
            )
        if len(activation_sparsity_pattern) != num_hidden_layers:
            raise ValueError(
                "activation_sparsity_pattern must have an explicit activation sparsity value for every layer."
                f"Expected {num_hidden_layers} values but got {len(activation_sparsity_pattern)}."
            )
        if not all(0.0 <= float(s) < 1.0 for s in activation_sparsity_pattern):
            raise ValueError(
                f"activation_sparsity_pattern values must be in [0, 1) (0: dense), got {activation_sparsity_pattern}"
            )
        if not 0 <= altup_active_idx < altup_num_inputs:
            raise ValueError(
                f"altup_active_idx must index one of the altup_num_inputs ({altup_num_inputs}) streams, got "
                f"{altup_active_idx}"
            )
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
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)
        self.final_logit_softcapping = final_logit_softcapping
        self.vocab_size_per_layer_input = vocab_size_per_layer_input
        self.hidden_size_per_layer_input = hidden_size_per_layer_input
        self.altup_active_idx = altup_active_idx
        self.altup_coef_clip = altup_coef_clip
        self.altup_correct_scale = altup_correct_scale
        self.altup_num_inputs = altup_num_inputs
        self.num_kv_shared_layers = num_kv_shared_layers
        self.laurel_rank = laurel_rank
        self.activation_sparsity_pattern = list(activation_sparsity_pattern)

    # Copied from transformers_static.models.gemma4.configuration_gemma4.Gemma4TextConfig.kv_sharing_modes
    @property
    def kv_sharing_modes(self) -> list[str | None]:
        """Per layer: "reuse" for the last `num_kv_shared_layers` (they attend another layer's keys/values), "store"
        for the last earlier layer of each kind (its keys/values are the ones reused), None otherwise. A ValueError
        (upstream's) when a kind of the shared layers has no earlier layer."""
        if self.num_kv_shared_layers == 0:
            return [None] * self.num_hidden_layers
        first_shared = self.num_hidden_layers - self.num_kv_shared_layers
        modes: list[str | None] = [None if i < first_shared else "reuse" for i in range(self.num_hidden_layers)]
        if set(self.layer_types[:first_shared]) != set(self.layer_types):
            raise ValueError(
                "The set of layer types producing a cache is different than the set of layer types using them"
            )
        for kind in set(self.layer_types):
            modes[max(i for i in range(first_shared) if self.layer_types[i] == kind)] = "store"
        return modes

    def kv_cache_shape(self, layer_idx: int) -> tuple[int, int] | None:
        """(num_key_value_heads, head_dim) of layer `layer_idx`'s cache slots, or None for a layer that reuses
        another's keys/values (it keeps none)."""
        if self.kv_sharing_modes[layer_idx] == "reuse":
            return None
        return self.num_key_value_heads, self.head_dim


# Copied from transformers_static.models.gemma3.configuration_gemma3.rope_parameters_by_kind
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
