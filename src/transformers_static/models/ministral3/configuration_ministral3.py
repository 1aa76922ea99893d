# Generated from modular_ministral3.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Ministral3 (the text model of Ministral 3 / Mistral 3): Mistral with YaRN rotary positions and Llama 4's query
scaling by position, `1 + beta * log(1 + floor(position / original_max_position_embeddings))` (`beta` is
`rope_parameters["llama_4_scaling_beta"]`), applied to the rotated queries; a sliding window on every layer when
`sliding_window` is set (none by default)."""

from __future__ import annotations

import logging
from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class Ministral3Config(PretrainedConfig):
    """Mistral's fields with Ministral 3's defaults: YaRN (factor 16 over 16384 positions) and Llama 4's query
    scaling in `rope_parameters`, which must name `llama_4_scaling_beta` and `original_max_position_embeddings`
    (upstream's attention reads both); no sliding window. `layer_types` is ignored, with a warning, as upstream
    (the `ministral` model type alternates windows)."""

    model_type = "ministral3"
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
        vocab_size: int = 131072,
        hidden_size: int = 4096,
        intermediate_size: int = 14336,
        num_hidden_layers: int = 34,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 8,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 262144,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        rope_parameters: dict[str, Any] | None = None,
        sliding_window: int | None = None,
        attention_dropout: float = 0.0,
        pad_token_id: int | None = 11,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        if rope_parameters is None and kwargs.get("rope_scaling") is None:
            rope_parameters = {
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 16.0,
                "original_max_position_embeddings": 16384,
                "max_position_embeddings": max_position_embeddings,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale_all_dim": 1.0,
                "mscale": 1.0,
                "llama_4_scaling_beta": 0.1,
            }
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        scaling_keys = ("llama_4_scaling_beta", "original_max_position_embeddings")  # what the attention reads
        missing = [key for key in scaling_keys if rope_parameters.get(key) is None]
        if missing:
            raise ValueError(
                f"rope_parameters must set {missing} for Ministral3's query scaling by position, got {rope_parameters}"
            )
        if kwargs.pop("layer_types", None) is not None:
            logging.getLogger(__name__).warning(
                "Ministral3 ignores layer_types (as upstream); the ministral model type alternates windows"
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
        self.sliding_window = sliding_window
        self.attention_dropout = attention_dropout
