"""Bloom configuration, with upstream's field names (`n_layer`, `n_head`, `hidden_size`) and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig


class BloomConfig(PretrainedConfig):
    """Configuration of a Bloom model. `num_hidden_layers` and `num_attention_heads` are aliases of `n_layer` and
    `n_head` (through `attribute_map`, as upstream has it) and are accepted as constructor arguments too; the
    `n_embed` of older checkpoints is read as `hidden_size`.

    `pretraining_tp` and `slow_but_exact` are kept for round trips; the sliced Megatron-style projection that
    upstream runs when both are set is the same product as the plain one up to rounding, so it is not reproduced.
    """

    model_type = "bloom"
    attribute_map = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"}
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "h.*.self_attention.query_key_value": "colwise_qkv_groups",
        "h.*.self_attention.dense": "rowwise",
        "h.*.mlp.dense_h_to_4h": "colwise",
        "h.*.mlp.dense_4h_to_h": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 250880,
        hidden_size: int = 64,
        n_layer: int = 2,
        n_head: int = 8,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        apply_residual_connection_post_layernorm: bool = False,
        hidden_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        pretraining_tp: int = 1,
        slow_but_exact: bool = False,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        pad_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Popped so they are not set after (and then overwritten by) Bloom's own fields below.
        hidden_size = kwargs.pop("n_embed", None) or hidden_size
        n_layer = kwargs.pop("num_hidden_layers", n_layer)
        n_head = kwargs.pop("num_attention_heads", n_head)
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.n_layer = n_layer
        self.n_head = n_head
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.hidden_dropout = hidden_dropout
        self.attention_dropout = attention_dropout
        self.pretraining_tp = pretraining_tp
        self.slow_but_exact = slow_but_exact
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.n_head < 1 or self.hidden_size % self.n_head:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by n_head ({self.n_head})")
