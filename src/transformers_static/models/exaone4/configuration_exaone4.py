# Generated from modular_exaone4.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""EXAONE 4.0: Qwen3's attention (a per-head RMSNorm on queries and keys, no biases) in OLMo2's block (each sublayer
reads the raw residual stream and its output is normed before it is added back: `post_attention_layernorm`,
`post_feedforward_layernorm`), with sliding-window layers beside global ones (`layer_types`, by default every
`sliding_window_pattern`-th layer global). In such a hybrid only the sliding layers rotate queries and keys; the
global layers have no position encoding (without a `sliding_window` every layer is global and rotates).

A single 4D `attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind
its own 4D mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters


class Exaone4Config(PretrainedConfig):
    """EXAONE 4.0's fields: no `head_dim` field (a config.json's is honoured, else `hidden_size // heads`), and
    `layer_types` derived, when the config lists none, from `sliding_window_pattern`: layer i is global when
    `(i + 1) % sliding_window_pattern == 0` and sliding otherwise; every layer is global without a `sliding_window`
    (or without a pattern). A pattern string ("LLLG") is refused unless `layer_types` is given (upstream cannot
    derive layer_types from it either)."""

    model_type = "exaone4"
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
        vocab_size: int = 102400,
        hidden_size: int = 4096,
        intermediate_size: int = 16384,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        rope_parameters: dict[str, Any] | None = None,
        attention_dropout: float = 0.0,
        sliding_window: int | None = 4096,
        sliding_window_pattern: str | int | None = 4,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        head_dim = kwargs.pop("head_dim", None)
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
        if sliding_window is None:
            sliding_window_pattern = 0
        if layer_types is None:
            if isinstance(sliding_window_pattern, str):
                raise ValueError(
                    f"sliding_window_pattern {sliding_window_pattern!r} (a string) needs layer_types listed beside "
                    "it; give an int pattern (every n-th layer global) or layer_types"
                )
            layer_types = [
                SLIDING_ATTENTION if sliding_window_pattern and (i + 1) % sliding_window_pattern else FULL_ATTENTION
                for i in range(num_hidden_layers)
            ]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is None")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.sliding_window_pattern = sliding_window_pattern
        self.layer_types = list(layer_types)
