"""Qwen3 configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class Qwen3Config(PretrainedConfig):
    """Qwen2's fields with an explicit `head_dim` (default 128, not `hidden_size // num_attention_heads`) and an
    `attention_bias` switch for all four attention projections (off by default).

    As upstream: without `use_sliding_window` the `sliding_window` is dropped (None), and `layer_types` (one of
    "full_attention" / "sliding_attention" per layer) is derived from them unless the config lists it: sliding on
    the layers at or beyond `max_window_layers`.
    """

    model_type = "qwen3"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # q_norm / k_norm act on one head's `head_dim` and are replicated, as every norm is.
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
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 22016,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        head_dim: int = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        use_sliding_window: bool = False,
        sliding_window: int | None = 4096,
        max_window_layers: int = 28,
        layer_types: list[str] | None = None,
        attention_dropout: float = 0.0,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if not isinstance(head_dim, int):
            raise ValueError(f"head_dim must be an int (Qwen3 does not derive it from hidden_size), got {head_dim!r}")
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        sliding_window = sliding_window if use_sliding_window else None
        if layer_types is None:
            layer_types = [
                SLIDING_ATTENTION if sliding_window is not None and i >= max_window_layers else FULL_ATTENTION
                for i in range(num_hidden_layers)
            ]
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.layer_types = list(layer_types)
        self.attention_dropout = attention_dropout


# Copied from transformers_static.models.qwen2.configuration_qwen2._check_layer_types
def _check_layer_types(layer_types: list[str], num_hidden_layers: int, sliding_window: int | None) -> None:
    """One known kind per layer, and a window for the sliding ones."""
    if len(layer_types) != num_hidden_layers:
        raise ValueError(
            f"layer_types must list one kind per layer ({num_hidden_layers}), got {len(layer_types)}: {layer_types}"
        )
    unknown = sorted(set(layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION})
    if unknown:
        raise ValueError(f"layer_types may only hold {FULL_ATTENTION!r} and {SLIDING_ATTENTION!r}, got {unknown}")
    if SLIDING_ATTENTION in layer_types and sliding_window is None:
        raise ValueError(
            "layer_types has sliding_attention layers but there is no sliding_window "
            "(set use_sliding_window=True and sliding_window to the number of keys)"
        )
