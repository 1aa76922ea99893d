"""GPT-2 configuration, with upstream's field names (`n_embd`, `n_head`, ...) and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig


class GPT2Config(PretrainedConfig):
    """Configuration of a GPT-2 model. The generic names (`hidden_size`, `num_attention_heads`,
    `num_hidden_layers`, `max_position_embeddings`) are aliases of GPT-2's own, read and written through
    `attribute_map`, and are accepted as constructor arguments too."""

    model_type = "gpt2"
    attribute_map = {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "max_position_embeddings": "n_positions",
    }
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "h.*.attn.c_attn": "colwise_qkv_blocks",
        "h.*.attn.c_proj": "rowwise",
        "h.*.mlp.c_fc": "colwise",
        "h.*.mlp.c_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 50257,
        n_positions: int = 1024,
        n_embd: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        n_inner: int | None = None,
        activation_function: str = "gelu_new",
        resid_pdrop: float = 0.1,
        embd_pdrop: float = 0.1,
        attn_pdrop: float = 0.1,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        summary_type: str = "cls_index",
        summary_use_proj: bool = True,
        summary_activation: str | None = None,
        summary_proj_to_labels: bool = True,
        summary_first_dropout: float = 0.1,
        scale_attn_weights: bool = True,
        scale_attn_by_inverse_layer_idx: bool = False,
        reorder_and_upcast_attn: bool = False,
        add_cross_attention: bool = False,
        bos_token_id: int | None = 50256,
        eos_token_id: int | list[int] | None = 50256,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Upstream also accepts the generic names as arguments; popped here so they are not set after (and then
        # overwritten by) GPT-2's own fields below.
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
        self.n_inner = n_inner
        self.activation_function = activation_function
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attn_pdrop = attn_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        # The summary_* fields configure upstream's GPT2DoubleHeadsModel; kept so a round trip loses nothing.
        self.summary_type = summary_type
        self.summary_use_proj = summary_use_proj
        self.summary_activation = summary_activation
        self.summary_proj_to_labels = summary_proj_to_labels
        self.summary_first_dropout = summary_first_dropout
        self.scale_attn_weights = scale_attn_weights
        self.scale_attn_by_inverse_layer_idx = scale_attn_by_inverse_layer_idx
        self.reorder_and_upcast_attn = reorder_and_upcast_attn
        self.add_cross_attention = add_cross_attention
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.add_cross_attention:
            raise ValueError(
                "add_cross_attention=True is not supported: GPT-2 here is a decoder-only causal LM "
                "(upstream's cross-attention layers for encoder-decoder use are out of scope)"
            )
