"""CTRL configuration, with upstream's field names (`n_embd`, `n_head`, `dff`, ...) and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig


class CTRLConfig(PretrainedConfig):
    """Configuration of a CTRL model (Salesforce/ctrl). The generic names (`hidden_size`, `num_attention_heads`,
    `num_hidden_layers`, `max_position_embeddings`) are aliases of CTRL's own, read and written through
    `attribute_map`, and are accepted as constructor arguments too. `layer_norm_epsilon` is the final LayerNorm's;
    the blocks' LayerNorms use 1e-6 whatever it is, as upstream's."""

    model_type = "ctrl"
    attribute_map = {
        "max_position_embeddings": "n_positions",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "h.*.multi_head_attention.Wq": "colwise",
        "h.*.multi_head_attention.Wk": "colwise",
        "h.*.multi_head_attention.Wv": "colwise",
        "h.*.multi_head_attention.dense": "rowwise",
        "h.*.ffn.0": "colwise",
        "h.*.ffn.2": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 246534,
        n_positions: int = 256,
        n_embd: int = 1280,
        dff: int = 8192,
        n_layer: int = 48,
        n_head: int = 16,
        resid_pdrop: float = 0.1,
        embd_pdrop: float = 0.1,
        layer_norm_epsilon: float = 1e-6,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Upstream also accepts the generic names as arguments; popped here so they are not set after (and then
        # overwritten by) CTRL's own fields below.
        n_embd = kwargs.pop("hidden_size", n_embd)
        n_head = kwargs.pop("num_attention_heads", n_head)
        n_layer = kwargs.pop("num_hidden_layers", n_layer)
        n_positions = kwargs.pop("max_position_embeddings", n_positions)
        super().__init__(
            use_cache=use_cache,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.n_embd = n_embd
        self.dff = dff
        self.n_layer = n_layer
        self.n_head = n_head
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
