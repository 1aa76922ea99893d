"""XGLM configuration, with upstream's field names (`d_model`, `num_layers`, `attention_heads`, ...) and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig


class XGLMConfig(PretrainedConfig):
    """Configuration of an XGLM model. The generic names (`hidden_size`, `num_attention_heads`, `num_hidden_layers`)
    are aliases of XGLM's own, read and written through `attribute_map`, and accepted as constructor arguments too;
    `initializer_range` is an alias of `init_std`."""

    model_type = "xglm"
    attribute_map = {
        "num_attention_heads": "attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "num_layers",
        "initializer_range": "init_std",
    }
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.out_proj": "rowwise",
        "layers.*.fc1": "colwise",
        "layers.*.fc2": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 256008,
        max_position_embeddings: int = 2048,
        d_model: int = 1024,
        ffn_dim: int = 4096,
        num_layers: int = 24,
        attention_heads: int = 16,
        activation_function: str = "gelu",
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
        layerdrop: float = 0.0,
        init_std: float = 0.02,
        scale_embedding: bool = True,
        use_cache: bool = True,
        decoder_start_token_id: int | None = 2,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 2,
        add_cross_attention: bool = False,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Popped so the aliases are not set and then overwritten by XGLM's own fields below.
        d_model = kwargs.pop("hidden_size", d_model)
        attention_heads = kwargs.pop("num_attention_heads", attention_heads)
        num_layers = kwargs.pop("num_hidden_layers", num_layers)
        init_std = kwargs.pop("initializer_range", init_std)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.d_model = d_model
        self.ffn_dim = ffn_dim
        self.num_layers = num_layers
        self.attention_heads = attention_heads
        self.activation_function = activation_function
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.layerdrop = layerdrop
        self.init_std = init_std
        self.scale_embedding = scale_embedding
        self.decoder_start_token_id = decoder_start_token_id
        self.add_cross_attention = add_cross_attention
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.d_model % self.attention_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by attention_heads ({self.attention_heads})")
        if self.add_cross_attention:
            raise ValueError(
                "add_cross_attention=True is not supported: XGLM here is a decoder-only causal LM "
                "(upstream's cross-attention layers for encoder-decoder use are out of scope)"
            )
