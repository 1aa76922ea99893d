"""SmolLM3 configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class SmolLM3Config(PretrainedConfig):
    """Llama's fields (`attention_bias`, `mlp_bias`) plus NoPE layers and an optional sliding window.

    `no_rope_layers` holds one flag per layer (at least `num_hidden_layers` of them): 1 = the layer rotates its
    queries and keys, 0 = a NoPE layer (no position encoding at all). Unset, every `no_rope_layer_interval`-th
    layer is NoPE (layers 3, 7, ... by default). `layer_types`, unset, makes the NoPE layers sliding-window layers
    when `use_sliding_window` is set and `sliding_window` is not None, every other layer full causal. Unlike Qwen2,
    `sliding_window` is kept as given whatever `use_sliding_window` says, and it is what a listed
    "sliding_attention" layer's mask uses (as upstream's eager and sdpa masks do).

    The config declares no `head_dim` (upstream's neither): it is `hidden_size // num_attention_heads` unless
    config.json sets one, which upstream's attention then reads and which is then kept and saved.
    """

    model_type = "smollm3"
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
        vocab_size: int = 128256,
        hidden_size: int = 2048,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 36,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = 128004,
        bos_token_id: int | None = 128000,
        eos_token_id: int | list[int] | None = 128001,
        rope_parameters: dict[str, Any] | None = None,
        use_sliding_window: bool = False,
        sliding_window: int | None = None,
        no_rope_layers: list[int] | None = None,
        no_rope_layer_interval: int = 4,
        layer_types: list[str] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=2e6
        )
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
        if no_rope_layers is None:
            if no_rope_layer_interval < 1:
                raise ValueError(
                    f"no_rope_layer_interval must be a positive number of layers, got {no_rope_layer_interval}"
                )
            no_rope_layers = [int((i + 1) % no_rope_layer_interval != 0) for i in range(num_hidden_layers)]
        if len(no_rope_layers) < num_hidden_layers:
            raise ValueError(
                f"no_rope_layers must hold a flag (1 = RoPE, 0 = NoPE) for each of the {num_hidden_layers} layers, "
                f"got {len(no_rope_layers)}: {no_rope_layers}"
            )
        if layer_types is None:
            windowed = use_sliding_window and sliding_window is not None
            layer_types = [
                SLIDING_ATTENTION if windowed and not no_rope_layers[i] else FULL_ATTENTION
                for i in range(num_hidden_layers)
            ]
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
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
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.no_rope_layers = list(no_rope_layers)
        self.no_rope_layer_interval = no_rope_layer_interval
        self.layer_types = list(layer_types)
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias

    @property
    def head_dim(self) -> int:
        """`head_dim` as config.json gives it, else `hidden_size // num_attention_heads`."""
        return self.__dict__.get("head_dim") or self.hidden_size // self.num_attention_heads

    @head_dim.setter
    def head_dim(self, value: int | None) -> None:
        # Kept in the instance dict, so to_dict() writes it back only when a config.json (or the caller) set it.
        self.__dict__["head_dim"] = value


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
