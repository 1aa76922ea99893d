# Generated from modular_internlm3.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""InternLM3: Llama's architecture under a configuration of its own. As upstream, a checkpoint of this type loads as
`LlamaModel` / `LlamaForCausalLM` (models/llama) with an `InternLM3Config`; only the configuration lives here."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class InternLM3Config(PretrainedConfig):
    """Llama's fields with InternLM3-8B's defaults (explicit `head_dim` 128, 2 key/value heads), no
    `pretraining_tp`; `qkv_bias` and `bias` alias `attention_bias` and `mlp_bias`, which must agree (as upstream:
    Llama's classes use one bias setting for every projection of a layer)."""

    model_type = "internlm3"
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
        vocab_size: int = 128512,
        hidden_size: int = 4096,
        intermediate_size: int = 10240,
        num_hidden_layers: int = 48,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 2,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 2,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        head_dim: int | None = 128,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("pretraining_tp", None)  # upstream's InternLM3 has no such field
        attention_bias = kwargs.pop("qkv_bias", attention_bias)
        mlp_bias = kwargs.pop("bias", mlp_bias)
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
            )
        if attention_bias != mlp_bias:
            raise ValueError(
                f"InternLM3 with qkv_bias / attention_bias ({attention_bias}) different from bias / mlp_bias "
                f"({mlp_bias}) is not supported: Llama's classes use one bias setting for every projection"
            )
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
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
        self.mlp_bias = mlp_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads

    attribute_map = {"qkv_bias": "attention_bias", "bias": "mlp_bias"}
