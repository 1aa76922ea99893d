# Generated from modular_apertus.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Apertus (swiss-ai/Apertus-8B): Llama with a gate-free MLP (`up_proj`, `down_proj`, no biases) whose xIELU
activation has learned parameters (`mlp.act_fn.alpha_p` / `alpha_n`), an RMSNorm over each query and key head
before the rotary positions (as Qwen3's), norms named `attention_layernorm` / `feedforward_layernorm`, and llama3
rope scaling (theta 12e6, factor 8) by default."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class ApertusConfig(PretrainedConfig):
    """Upstream's fields and defaults (Apertus-8B's sizes, `hidden_act="xielu"`); no `mlp_bias` (the MLP never has
    biases) or `pretraining_tp`. `head_dim` is no upstream field but is honoured when a config.json sets it, as
    upstream's attention reads it."""

    model_type = "apertus"
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 131072,
        hidden_size: int = 4096,
        intermediate_size: int = 14336,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "xielu",
        max_position_embeddings: int = 65536,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 3,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        rope_theta, rope_scaling = kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        if rope_parameters is None and rope_scaling is None:
            rope_parameters = dict(self.default_rope_parameters)
        rope_parameters = standardize_rope_parameters(
            rope_parameters, rope_theta, rope_scaling, self.default_rope_parameters["rope_theta"]
        )
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
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
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.head_dim = head_dim or hidden_size // num_attention_heads

    # upstream's rope when a config gives neither `rope_parameters` nor `rope_scaling` (a `rope_theta` alone is
    # ignored, as upstream ignores it)
    default_rope_parameters = {
        "rope_type": "llama3",
        "rope_theta": 12000000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }
