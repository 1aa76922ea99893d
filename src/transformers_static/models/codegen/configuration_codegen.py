"""CodeGen configuration, with upstream's field names (`n_embd`, `n_head`, `rotary_dim`, ...) and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig

# CodeGen's fused qkv_proj was laid out for 4 model-parallel TPU cores: its output is 4 blocks, each holding the
# queries, values and keys (in that order) of a quarter of the heads. Upstream hard-codes it too.
MP_NUM = 4


class CodeGenConfig(PretrainedConfig):
    """Configuration of a CodeGen model. The generic names (`hidden_size`, `num_attention_heads`,
    `num_hidden_layers`, `max_position_embeddings`) are aliases of CodeGen's own, read and written through
    `attribute_map`, and are accepted as constructor arguments too.

    `rotary_dim` is how many leading dims of each head rotate (interleaved pairs). `n_ctx` is kept for round trips:
    upstream reads it into an attribute nothing uses, so it changes nothing here either.
    """

    model_type = "codegen"
    attribute_map = {
        "max_position_embeddings": "n_positions",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }

    def __init__(
        self,
        vocab_size: int = 50400,
        n_positions: int = 2048,
        n_ctx: int = 2048,
        n_embd: int = 4096,
        n_layer: int = 28,
        n_head: int = 16,
        rotary_dim: int = 64,
        n_inner: int | None = None,
        activation_function: str = "gelu_new",
        resid_pdrop: float = 0.0,
        embd_pdrop: float = 0.0,
        attn_pdrop: float = 0.0,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        bos_token_id: int | None = 50256,
        eos_token_id: int | list[int] | None = 50256,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        # Popped so they are not set after (and then overwritten by) CodeGen's own fields below.
        n_embd = kwargs.pop("hidden_size", n_embd)
        n_head = kwargs.pop("num_attention_heads", n_head)
        n_layer = kwargs.pop("num_hidden_layers", n_layer)
        n_positions = kwargs.pop("max_position_embeddings", n_positions)
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.n_ctx = n_ctx
        self.n_embd = n_embd
        self.n_layer = n_layer
        self.n_head = n_head
        self.rotary_dim = rotary_dim
        self.n_inner = n_inner
        self.activation_function = activation_function
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attn_pdrop = attn_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def rotary_ndims(self) -> int:
        """How many leading dims of each head rotate (the width of the sinusoidal table)."""
        return self.rotary_dim

    def validate(self) -> None:
        """Raise a ValueError for a configuration upstream cannot run either (also run at model init, as configs
        are mutable)."""
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_head % MP_NUM:
            raise ValueError(
                f"n_head ({self.n_head}) must be divisible by {MP_NUM}: CodeGen's qkv_proj packs the heads in "
                f"{MP_NUM} blocks of n_head / {MP_NUM} heads (upstream's mp_num)"
            )
        if not isinstance(self.rotary_dim, int) or not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ValueError(
                f"rotary_dim ({self.rotary_dim}) must be an even int in 2..head_dim ({self.head_dim}): it rotates "
                "interleaved pairs of each head's leading dims (upstream's None, a table over the whole embedding, "
                "only runs with one head)"
            )
