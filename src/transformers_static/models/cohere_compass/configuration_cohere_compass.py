# Generated from modular_cohere_compass.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Cohere Compass (North) text decoder, model_type `cohere_compass_text`: Cohere2's blocks (attention and a SwiGLU
MLP in parallel off one mean-centred LayerNorm, logits multiplied by `logit_scale`, sliding-window layers beside
global ones) with rotary parameters per layer kind (`rope_parameters = {"sliding_attention": {...},
"full_attention": None}`: a kind given None has no position encoding) and rotary over halves (`rotate_half`, as
Llama), not Cohere2's interleaved pairs. By default every layer is global and `logit_scale` is None (1.0).

Upstream's rotary is the multimodal M-RoPE (`mrope_section`); on text, whose three position axes are equal, it is
plain RoPE, which is what this decoder computes (`position_ids` `[batch, q_len]`). One mask per layer kind per
forward; a single 4D `attention_mask` is used as given by every layer (pass a dict by kind to give each its own)."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import SUPPORTED_ROPE_TYPES


class CohereCompassTextConfig(PretrainedConfig):
    """Cohere Compass's text decoder: Cohere2's fields with upstream's defaults here (every layer global unless
    `layer_types` says otherwise; no `sliding_window_pattern`, which is kept as an unused field as upstream does;
    `logit_scale` None, i.e. 1.0), `rope_parameters` by layer kind (each kind a dict of a supported `rope_type` with
    a `rope_theta`, or None for no position encoding; the model needs an entry for each kind it uses) and
    `pooling` (read by upstream's sequence-classification head only). `head_dim` is `hidden_size //
    num_attention_heads` unless given. As upstream, a top-level `rope_theta` / `rope_type` beside per-kind entries
    (left in published configs) is dropped."""

    model_type = "cohere_compass_text"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
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
        vocab_size: int = 256000,
        hidden_size: int = 8192,
        intermediate_size: int = 22528,
        logit_scale: float | None = None,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 5,
        eos_token_id: int | list[int] | None = 255001,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        sliding_window: int | None = 4096,
        layer_types: list[str] | None = None,
        pooling: str | None = None,
        **kwargs: Any,
    ) -> None:
        head_dim = kwargs.pop("head_dim", None) or hidden_size // num_attention_heads
        layer_types = [FULL_ATTENTION] * num_hidden_layers if layer_types is None else list(layer_types)
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
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.logit_scale = logit_scale
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = self._rope_parameters_by_kind(rope_parameters, layer_types, max_position_embeddings)
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.layer_types = layer_types
        self.pooling = pooling

    @staticmethod
    def _rope_parameters_by_kind(
        rope_parameters: dict[str, Any] | None, layer_types: list[str], max_position_embeddings: int
    ) -> dict[str, Any]:
        """Upstream's standardisation of per-kind rotary parameters: each kind's dict gets a `rope_type` ("default"
        unless given, or its old `type`) and, for the scaled types, `original_max_position_embeddings`; a top-level
        `rope_theta` / `rope_type` beside them is dropped. A dict of no layer kind is kept as given (the model refuses
        it: it needs one entry per kind). A rope type this library cannot apply, or a kind's dict without a
        `rope_theta`, is refused."""
        params = dict(rope_parameters or {})
        kinds = [kind for kind in params if kind in layer_types]
        if not kinds:
            return params
        params.pop("rope_theta", None)
        params.pop("rope_type", None)
        for kind in kinds:
            if params[kind] is None:
                continue
            kind_params = params[kind] = dict(params[kind])
            kind_params.setdefault("rope_type", kind_params.get("type", "default"))
            if kind_params["rope_type"] not in SUPPORTED_ROPE_TYPES:
                raise ValueError(
                    f"rope_parameters[{kind!r}] has rope_type {kind_params['rope_type']!r}; supported: "
                    f"{SUPPORTED_ROPE_TYPES} (position-dependent types such as 'dynamic' would change values per step)"
                )
            if kind_params.get("rope_theta") is None:
                raise ValueError(f"rope_parameters[{kind!r}] needs a rope_theta, got {kind_params}")
            if kind_params["rope_type"] in ("llama3", "yarn"):
                kind_params.setdefault("original_max_position_embeddings", max_position_embeddings)
        return params


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
