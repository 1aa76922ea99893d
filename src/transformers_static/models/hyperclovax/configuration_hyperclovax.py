# Generated from modular_hyperclovax.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""HyperCLOVA X (SEED Think): Granite's MuP multipliers with two changes: an RMSNorm on each sublayer's output before
its residual add (Peri-Layer Normalization, `use_post_norm`), and logits MULTIPLIED by `logits_scaling` (Granite
divides); attention scores are scaled by `attention_multiplier`, `head_dim ** -0.5` unless the config sets it."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class HyperCLOVAXConfig(PretrainedConfig):
    """Granite's fields and defaults plus `head_dim` (`hidden_size // num_attention_heads` unless given; saved, as
    upstream) and `use_post_norm` (True: an RMSNorm after attention and after the MLP, `post_norm1` / `post_norm2`);
    `attention_multiplier` None means `head_dim ** -0.5`, and `logits_scaling` multiplies the logits. As upstream,
    `hidden_size` must be a multiple of `num_attention_heads` even when `head_dim` is given."""

    model_type = "hyperclovax"
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
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        residual_multiplier: float = 1.0,
        attention_multiplier: float | None = None,
        head_dim: int | None = None,
        use_post_norm: bool = True,
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
            use_cache=use_cache,
            **kwargs,
        )
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
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
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.residual_multiplier = residual_multiplier
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.attention_multiplier = self.head_dim**-0.5 if attention_multiplier is None else attention_multiplier
        self.use_post_norm = use_post_norm

    @property
    def head_dim(self) -> int:
        """`hidden_size // num_attention_heads`, unless the config sets a `head_dim` (upstream has no such field but
        its attention and rotary read one when config.json holds it; it is saved only when set)."""
        return self.__dict__.get("head_dim") or self.hidden_size // self.num_attention_heads

    @head_dim.setter
    def head_dim(self, value: int | None) -> None:
        self.__dict__["head_dim"] = value
