# Generated from modular_helium.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Helium (kyutai/helium-1-preview): Llama with rotary positions over INTERLEAVED pairs of each head (dims 2i,
2i + 1), an RMSNorm that scales in float32, and an `o_proj` without bias (`attention_bias` sets q/k/v's only)."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class HeliumConfig(PretrainedConfig):
    """Upstream's fields and defaults (helium-1-preview's sizes, rope_theta 100000); no `pretraining_tp`, as
    upstream. Upstream's `o_proj` reads `hidden_size` inputs, so `num_attention_heads * head_dim` must equal it."""

    model_type = "helium"
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
        vocab_size: int = 48000,
        hidden_size: int = 2560,
        intermediate_size: int = 7040,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 20,
        num_key_value_heads: int | None = 20,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        attention_dropout: float = 0.0,
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-8,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        pad_token_id: int | None = 3,
        eos_token_id: int | list[int] | None = 2,
        bos_token_id: int | None = 1,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=100000.0
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
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.attention_dropout = attention_dropout
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        if num_attention_heads * self.head_dim != hidden_size:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) * head_dim ({self.head_dim}) must equal hidden_size "
                f"({hidden_size}): Helium's o_proj takes hidden_size inputs"
            )
