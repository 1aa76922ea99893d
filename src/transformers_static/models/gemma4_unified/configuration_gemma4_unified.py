# Generated from modular_gemma4_unified.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Gemma 4 unified (text decoder, model_type `gemma4_unified_text`): Gemma 4's decoder without per-layer input
embeddings and without experts. As Gemma 4:

- Gemma 3's blocks (norms before and after attention and MLP, sqrt(hidden_size)-scaled embeddings, GeGLU MLP),
  sliding-window and full layers with their own rotary tables ("default" / "proportional" rope);
- RMSNorm scaled by `weight` (not `1 + weight`), over queries, keys and (without a scale) values; scores unscaled;
- per-layer head sizes (`config.layer_head_dim`, `layer_num_key_value_heads`: the global layers' own);
- values equal to the keys' projection on full layers (`attention_k_eq_v`: no `v_proj`);
- key/value sharing: the last `num_kv_shared_layers` layers attend the keys/values of the last earlier layer of
  their kind ("store" -> "reuse"), which the forward hands down; they have no key/value projections and never write
  the cache (with `use_double_wide_mlp`, their MLP is twice as wide);
- a per-layer output scale (`layer_scalar`, a checkpoint buffer) and optional final logit soft-capping.
"""

from __future__ import annotations

import logging
from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION

logger = logging.getLogger(__name__)

# The rotary parameters when the config names none: local layers plain, global layers proportional on a quarter.
DEFAULT_ROPE_PARAMETERS = {
    SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL_ATTENTION: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}

ROPE_TYPES = ("default", "proportional")

# What `per_layer_config` may override per layer (upstream's attention reads these two from its layer's config).
PER_LAYER_FIELDS = ("head_dim", "num_key_value_heads")

BIDIRECTIONAL_MODES = (None, "all", "vision")


class Gemma4UnifiedTextConfig(PretrainedConfig):
    """The unified Gemma 4's decoder: Gemma 4's text fields (`layer_types`, five to one by default, the last layer
    always full; `rope_parameters` by kind; `per_layer_config` / `global_head_dim` / `num_global_key_value_heads`;
    `attention_k_eq_v`; `num_kv_shared_layers`; `use_double_wide_mlp`; `final_logit_softcapping`) without the
    per-layer input embeddings and experts (`hidden_size_per_layer_input`, `enable_moe_block`, ... are no fields:
    given, they are kept unread, as upstream), with its defaults (a 1024-key window, 262144 positions,
    `use_bidirectional_attention="vision"`).

    `use_bidirectional_attention="vision"` changes nothing in a text-only model (text tokens are causal, as
    upstream); "all" is refused by the model (every mask here is causal). The config keeps it as upstream does (the
    window halved, written back doubled).
    """

    model_type = "gemma4_unified_text"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # The query/key norms act on each head with one weight: replicated, like every module not listed (the router,
    # the experts and the per-layer input projections too). k/v projections split by their own layer's layout
    # (global layers: `global_head_dim`, `num_global_key_value_heads`; one head fewer than ranks is replicated).
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
        vocab_size: int = 262_144,
        hidden_size: int = 2304,
        intermediate_size: int = 9216,
        num_hidden_layers: int = 30,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 4,
        head_dim: int = 256,
        hidden_activation: str = "gelu_pytorch_tanh",
        max_position_embeddings: int = 262_144,
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
        sliding_window: int = 1024,
        layer_types: list[str] | None = None,
        final_logit_softcapping: float | None = None,
        use_bidirectional_attention: str | None = "vision",
        attention_k_eq_v: bool = False,
        num_kv_shared_layers: int = 0,
        use_double_wide_mlp: bool = False,
        per_layer_config: dict[int | str, dict[str, Any]] | None = None,
        global_head_dim: int = 512,
        num_global_key_value_heads: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if use_bidirectional_attention not in BIDIRECTIONAL_MODES:
            raise ValueError(
                f"use_bidirectional_attention must be one of {BIDIRECTIONAL_MODES}, got {use_bidirectional_attention!r}"
            )
        if use_bidirectional_attention == "all":  # upstream's exclusive bounds; to_dict writes the given value back
            sliding_window = sliding_window // 2 + 1
        if layer_types is None:  # every sixth layer is full, the others slide
            layer_types = [FULL_ATTENTION if (i + 1) % 6 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        layer_types = list(layer_types)
        if layer_types and layer_types[-1] != FULL_ATTENTION:
            logger.warning(
                "Last layer must use %r, but got %r. Forcing last layer to %r.",
                FULL_ATTENTION,
                layer_types[-1],
                FULL_ATTENTION,
            )
            layer_types[-1] = FULL_ATTENTION
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        if rope_parameters is None:
            rope_parameters = {kind: dict(params) for kind, params in DEFAULT_ROPE_PARAMETERS.items()}
        _check_rope_parameters(rope_parameters, layer_types)
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
        self.layer_types = layer_types
        self.final_logit_softcapping = final_logit_softcapping
        self.use_bidirectional_attention = use_bidirectional_attention
        self.attention_k_eq_v = attention_k_eq_v
        self.num_kv_shared_layers = num_kv_shared_layers
        self.use_double_wide_mlp = use_double_wide_mlp
        if per_layer_config is None:  # upstream's default: the global fields on every full layer
            overrides: dict[str, Any] = {"head_dim": global_head_dim}
            if attention_k_eq_v and num_global_key_value_heads is not None:
                overrides["num_key_value_heads"] = num_global_key_value_heads
            per_layer_config = {i: dict(overrides) for i, kind in enumerate(layer_types) if kind == FULL_ATTENTION}
        self._layer_overrides = self._normalized_overrides(per_layer_config)

    def _normalized_overrides(self, per_layer_config: dict[int | str, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """`{layer: {field: value}}` as upstream keeps it: integer layers, overrides equal to the global field dropped,
        layers left with none dropped. Fields other than PER_LAYER_FIELDS are refused."""
        overrides = {}
        for layer, fields in per_layer_config.items():
            layer = int(layer)
            if not 0 <= layer < self.num_hidden_layers:
                raise ValueError(
                    f"per_layer_config keys must be layer indices in [0, {self.num_hidden_layers}), got {layer}"
                )
            unknown = sorted(set(fields) - set(PER_LAYER_FIELDS))
            if unknown:
                raise ValueError(
                    f"per_layer_config may override {PER_LAYER_FIELDS} per layer here; layer {layer} overrides "
                    f"{unknown}, which upstream's Gemma 4 layers do not read per layer"
                )
            kept = {name: value for name, value in fields.items() if value != getattr(self, name)}
            if kept:
                overrides[layer] = kept
        return dict(sorted(overrides.items()))

    def layer_head_dim(self, layer_idx: int) -> int:
        """The head dimension of layer `layer_idx` (its override, else `head_dim`)."""
        return self._layer_overrides.get(layer_idx, {}).get("head_dim", self.head_dim)

    def layer_num_key_value_heads(self, layer_idx: int) -> int:
        """The key/value heads of layer `layer_idx` (its override, else `num_key_value_heads`)."""
        return self._layer_overrides.get(layer_idx, {}).get("num_key_value_heads", self.num_key_value_heads)

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
        return self.layer_num_key_value_heads(layer_idx), self.layer_head_dim(layer_idx)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.use_bidirectional_attention == "all":  # the value given, so a reload halves it once more
            out["sliding_window"] = (self.sliding_window - 1) * 2
        width = len(str(max(self._layer_overrides))) if self._layer_overrides else 1
        out["per_layer_config"] = {str(i).zfill(width): dict(o) for i, o in self._layer_overrides.items()}
        return dict(sorted(out.items()))


def _check_rope_parameters(rope_parameters: dict[str, Any], layer_types: list[str]) -> None:
    """One dict per layer kind in use, each of a supported type with a `rope_theta`."""
    for kind in sorted(set(layer_types)):
        params = rope_parameters.get(kind)
        if not isinstance(params, dict):
            raise ValueError(
                f"rope_parameters must hold a dict for each layer kind ({kind!r} is missing): Gemma 4 reads "
                f"{{'sliding_attention': {{...}}, 'full_attention': {{...}}}}, got {rope_parameters}"
            )
        if params.get("rope_type", "default") not in ROPE_TYPES:
            raise ValueError(
                f"rope_parameters[{kind!r}] has rope_type {params.get('rope_type')!r}; Gemma 4 supports {ROPE_TYPES}"
            )
        if "rope_theta" not in params:
            raise ValueError(f"rope_parameters[{kind!r}] needs a rope_theta, got {params}")


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
