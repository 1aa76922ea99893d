"""CWM (Meta's Code World Model): Llama without attention biases, with llama3-scaled rotary positions, and
sliding-window layers beside global ones (`layer_types`; by default layer i is global when `i % 4 == 0`), one mask
per kind made once per forward.

A single 4D `attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind
its own 4D mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

from typing import Any

from torch import nn

from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import LlamaAttention, LlamaForCausalLM


class CwmConfig(LlamaConfig):
    """Llama's fields without `attention_bias`, with CWM's defaults (llama3 rope over 8192 positions, rope_theta
    1e6, head_dim 128, three Llama 3 EOS ids), `sliding_window` (8192; 0 or None: none) and `layer_types`."""

    def __init__(
        self,
        vocab_size: int = 128256,
        hidden_size: int = 6144,
        intermediate_size: int = 21504,
        num_hidden_layers: int = 64,
        num_attention_heads: int = 48,
        num_key_value_heads: int | None = 8,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        pretraining_tp: int = 1,
        rope_parameters: dict[str, Any] | None = None,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        head_dim: int | None = 128,
        sliding_window: int | None = 8192,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 128000,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        if rope_parameters is None and kwargs.get("rope_scaling") is None:
            rope_parameters = {
                "rope_theta": 1_000_000.0,
                "factor": 16.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            }
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=1e6
        )
        eos_token_id = [128001, 128008, 128009] if eos_token_id is None else eos_token_id
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
        sliding_window = int(sliding_window) if sliding_window else None
        if layer_types is None:
            layer_types = [FULL_ATTENTION if i % 4 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is {sliding_window}")
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
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)


class CwmAttention(LlamaAttention):
    """Llama's attention without biases."""

    def __init__(self, config: CwmConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)


class CwmForCausalLM(LlamaForCausalLM):
    pass
