"""OpenAI GPT (GPT-1) configuration, with upstream's field names (`n_embd`, `n_head`, `afn`, ...) and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig

# Upstream's `afn` names -> the activations it runs: its "gelu" is GPT's tanh approximation (gelu_new).
AFN_ACTIVATIONS = {"relu": "relu", "silu": "silu", "swish": "silu", "gelu": "gelu_new"}


class OpenAIGPTConfig(PretrainedConfig):
    """Configuration of an OpenAI GPT model. The generic names (`hidden_size`, `num_attention_heads`,
    `num_hidden_layers`, `max_position_embeddings`) are aliases of GPT's own, read and written through
    `attribute_map`, and are accepted as constructor arguments too. `afn` is one of upstream's four names (another
    is a ValueError, as upstream's is a KeyError); the `summary_*` fields configure upstream's double-heads model
    and are kept so a round trip loses nothing."""

    model_type = "openai-gpt"
    attribute_map = {
        "max_position_embeddings": "n_positions",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
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
        vocab_size: int = 40478,
        n_positions: int = 512,
        n_embd: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        afn: str = "gelu",
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
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Popped so the aliases are not set and then overwritten by GPT's own fields below.
        n_embd = kwargs.pop("hidden_size", n_embd)
        n_head = kwargs.pop("num_attention_heads", n_head)
        n_layer = kwargs.pop("num_hidden_layers", n_layer)
        n_positions = kwargs.pop("max_position_embeddings", n_positions)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.n_embd = n_embd
        self.n_layer = n_layer
        self.n_head = n_head
        self.afn = afn
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attn_pdrop = attn_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.summary_type = summary_type
        self.summary_use_proj = summary_use_proj
        self.summary_activation = summary_activation
        self.summary_proj_to_labels = summary_proj_to_labels
        self.summary_first_dropout = summary_first_dropout
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.afn not in AFN_ACTIVATIONS:
            raise ValueError(f"afn={self.afn!r} is not supported; upstream's names are {sorted(AFN_ACTIVATIONS)}")
