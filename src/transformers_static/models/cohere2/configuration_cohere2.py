"""Cohere2 configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class Cohere2Config(PretrainedConfig):
    """Cohere2 (Command R7B, Command A): sliding-window layers with rotary positions beside global layers with no
    position encoding (`layer_types`; by default every `sliding_window_pattern`-th layer, 4, is global), one
    LayerNorm feeding attention and MLP in parallel, logits multiplied by `logit_scale`.

    As upstream: `head_dim` is `hidden_size // num_attention_heads` unless given, and is saved; older configs'
    `sliding_window_pattern` is read into `layer_types` (and not kept) when the config lists no `layer_types`.
    """

    model_type = "cohere2"
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
        logit_scale: float = 0.0625,
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
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        head_dim = kwargs.pop("head_dim", None) or hidden_size // num_attention_heads
        if layer_types is None:
            pattern = kwargs.pop("sliding_window_pattern", 4)
            layer_types = [
                SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(num_hidden_layers)
            ]
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
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)


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
