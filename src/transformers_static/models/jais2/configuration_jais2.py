# Generated from modular_jais2.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Jais 2: Llama with LayerNorms (weight and bias, `layer_norm_eps`) in place of RMSNorms, a gate-free ReLU² MLP
(`up_proj`, `down_proj`, as Nemotron's) and biases on every attention and MLP projection by default."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class Jais2Config(PretrainedConfig):
    """Llama's fields with Jais-2-8B's defaults, `layer_norm_eps` for the LayerNorms, no `rms_norm_eps` or
    `pretraining_tp` (as upstream)."""

    model_type = "jais2"
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
        vocab_size: int = 150272,
        hidden_size: int = 3328,
        intermediate_size: int = 26624,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 26,
        num_key_value_heads: int | None = None,
        hidden_act: str = "relu2",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 150024,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = True,
        attention_dropout: float = 0.0,
        mlp_bias: bool = True,
        head_dim: int | None = None,
        layer_norm_eps: float = 1e-5,
        **kwargs: Any,
    ) -> None:
        if hidden_size % num_attention_heads:  # upstream's architecture check, whatever head_dim says
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
            )
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
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
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.layer_norm_eps = layer_norm_eps
