"""OPT configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig


class OPTConfig(PretrainedConfig):
    """Configuration of an OPT model.

    `do_layer_norm_before=False` is OPT-350m's post-LayerNorm block (and no final LayerNorm);
    `word_embed_proj_dim` below `hidden_size` adds `project_in`/`project_out` around the decoder (also 350m).
    `_remove_final_layer_norm` only keeps old fine-tuned checkpoints loadable (no final LayerNorm); upstream writes
    it to config.json, so it is written here too. `initializer_range` is an alias of OPT's `init_std`.
    """

    model_type = "opt"
    attribute_map = {"initializer_range": "init_std"}
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "decoder.layers.*.self_attn.q_proj": "colwise",
        "decoder.layers.*.self_attn.k_proj": "colwise_kv",
        "decoder.layers.*.self_attn.v_proj": "colwise_kv",
        "decoder.layers.*.self_attn.out_proj": "rowwise",
        "decoder.layers.*.fc1": "colwise",
        "decoder.layers.*.fc2": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 50272,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        ffn_dim: int = 3072,
        max_position_embeddings: int = 2048,
        do_layer_norm_before: bool = True,
        _remove_final_layer_norm: bool = False,
        word_embed_proj_dim: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        num_attention_heads: int = 12,
        activation_function: str = "relu",
        layerdrop: float = 0.0,
        init_std: float = 0.02,
        use_cache: bool = True,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = 2,
        eos_token_id: int | list[int] | None = 2,
        enable_bias: bool = True,
        layer_norm_elementwise_affine: bool = True,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Popped so the alias is not set (into init_std) and then overwritten by the default below.
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
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.ffn_dim = ffn_dim
        self.max_position_embeddings = max_position_embeddings
        self.do_layer_norm_before = do_layer_norm_before
        self._remove_final_layer_norm = _remove_final_layer_norm
        self.word_embed_proj_dim = word_embed_proj_dim if word_embed_proj_dim is not None else hidden_size
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.num_attention_heads = num_attention_heads
        self.activation_function = activation_function
        self.layerdrop = layerdrop
        self.init_std = init_std
        self.enable_bias = enable_bias
        self.layer_norm_elementwise_affine = layer_norm_elementwise_affine
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )

    def to_dict(self) -> dict[str, Any]:
        """The base fields plus `_remove_final_layer_norm`, which upstream writes despite its leading underscore."""
        out = super().to_dict()
        out["_remove_final_layer_norm"] = self._remove_final_layer_norm
        return dict(sorted(out.items()))
