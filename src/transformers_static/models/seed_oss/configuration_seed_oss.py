"""Seed-OSS: Llama with its own output-projection bias (`attention_out_bias`, apart from `attention_bias` on the
query/key/value projections), an explicit `head_dim`, and `residual_dropout` on the attention and MLP outputs while
training."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class SeedOssConfig(PretrainedConfig):
    """Llama's fields with Seed-OSS-36B's defaults (biased q/k/v, head_dim 128, dropouts of 0.1), plus
    `attention_out_bias` (a bias on o_proj) and `residual_dropout` (on each sublayer's output, training only)."""

    model_type = "seed_oss"
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
        vocab_size: int = 155136,
        hidden_size: int = 4096,
        intermediate_size: int = 27648,
        num_hidden_layers: int = 64,
        num_attention_heads: int = 80,
        num_key_value_heads: int | None = 8,
        hidden_act: str = "silu",
        max_position_embeddings: int = 524288,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 2,
        pretraining_tp: int = 1,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = True,
        attention_out_bias: bool = False,
        attention_dropout: float = 0.1,
        residual_dropout: float = 0.1,
        mlp_bias: bool = False,
        head_dim: int | None = 128,
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
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_out_bias = attention_out_bias
        self.attention_dropout = attention_dropout
        self.residual_dropout = residual_dropout
        self.mlp_bias = mlp_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads
