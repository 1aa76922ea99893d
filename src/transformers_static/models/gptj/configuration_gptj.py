"""GPT-J configuration, with upstream's field names (`n_embd`, `n_head`, `rotary_dim`, ...) and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig


class GPTJConfig(PretrainedConfig):
    """Configuration of a GPT-J model. The generic names (`hidden_size`, `num_attention_heads`,
    `num_hidden_layers`, `max_position_embeddings`) are aliases of GPT-J's own, read and written through
    `attribute_map`, and are accepted as constructor arguments too.

    `rotary_dim` is how many leading dims of each head rotate (interleaved pairs); `None` means the whole head.
    """

    model_type = "gptj"
    attribute_map = {
        "max_position_embeddings": "n_positions",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "h.*.attn.q_proj": "colwise",
        "h.*.attn.k_proj": "colwise_kv",
        "h.*.attn.v_proj": "colwise_kv",
        "h.*.attn.out_proj": "rowwise",
        "h.*.mlp.fc_in": "colwise",
        "h.*.mlp.fc_out": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 50400,
        n_positions: int = 2048,
        n_embd: int = 4096,
        n_layer: int = 28,
        n_head: int = 16,
        rotary_dim: int | None = 64,
        n_inner: int | None = None,
        activation_function: str = "gelu_new",
        resid_pdrop: float = 0.0,
        embd_pdrop: float = 0.0,
        attn_pdrop: float = 0.0,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        bos_token_id: int | None = 50256,
        eos_token_id: int | list[int] | None = 50256,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        # Popped so they are not set after (and then overwritten by) GPT-J's own fields below.
        n_embd = kwargs.pop("hidden_size", n_embd)
        n_head = kwargs.pop("num_attention_heads", n_head)
        n_layer = kwargs.pop("num_hidden_layers", n_layer)
        n_positions = kwargs.pop("max_position_embeddings", n_positions)
        super().__init__(
            bos_token_id=bos_token_id, eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
        )
        self.vocab_size = vocab_size
        self.n_positions = n_positions
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
        """How many leading dims of each head rotate: `rotary_dim`, or the whole head when it is None."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0 < self.rotary_ndims <= self.head_dim or self.rotary_ndims % 2:
            raise ValueError(
                f"rotary_dim ({self.rotary_dim}) must be even and in 2..head_dim ({self.head_dim}): "
                "it rotates interleaved pairs of each head's leading dims"
            )
