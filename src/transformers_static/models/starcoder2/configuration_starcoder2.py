"""Starcoder2 configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class Starcoder2Config(PretrainedConfig):
    """Llama's shape with LayerNorms (`norm_epsilon`), a GELU MLP (`c_fc`, `c_proj`), biases on every projection
    (`use_bias`), dropout on the residual branches and the embeddings, and a sliding window on every layer when
    `sliding_window` is set (None: full causal attention)."""

    model_type = "starcoder2"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.c_fc": "colwise",
        "layers.*.mlp.c_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 49152,
        hidden_size: int = 3072,
        intermediate_size: int = 12288,
        num_hidden_layers: int = 30,
        num_attention_heads: int = 24,
        num_key_value_heads: int = 2,
        hidden_act: str = "gelu_pytorch_tanh",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.018042,
        norm_epsilon: float = 1e-5,
        rope_parameters: dict[str, Any] | None = None,
        sliding_window: int | None = None,
        attention_dropout: float = 0.0,
        residual_dropout: float = 0.0,
        embedding_dropout: float = 0.0,
        use_bias: bool = True,
        bos_token_id: int | None = 50256,
        eos_token_id: int | list[int] | None = 50256,
        pad_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(
                f"sliding_window must be None (full attention) or a positive number of keys, got {sliding_window}"
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
        self.norm_epsilon = norm_epsilon
        self.rope_parameters = rope_parameters
        self.sliding_window = sliding_window
        self.attention_dropout = attention_dropout
        self.residual_dropout = residual_dropout
        self.embedding_dropout = embedding_dropout
        self.use_bias = use_bias


# Copied from transformers_static.models.phi.configuration_phi.head_dim with Phi->Starcoder2
def head_dim(config: Starcoder2Config) -> int:
    """Dims per head: `hidden_size // num_attention_heads` unless a config.json sets `head_dim`."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
