"""GPT-Neo configuration, with upstream's field names (`num_layers`, `num_heads`, `attention_types`, ...) and
defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION

# GPT-Neo's layer kinds -> this library's mask kinds
LAYER_KINDS = {"global": FULL_ATTENTION, "local": SLIDING_ATTENTION}


class GPTNeoConfig(PretrainedConfig):
    """Configuration of a GPT-Neo model: layers of global (full causal) and local attention, the local ones over
    the last `window_size` keys (the query's own included).

    `attention_types` lists `[[kinds, repeats], ...]` (default `[[["global", "local"], 12]]`); `attention_layers`,
    one kind per layer, is derived from it (and saved) as upstream does; a value read from config.json is replaced
    by it. `layer_types` and `sliding_window` are the same facts in the names the mask converter reads (not saved).
    """

    model_type = "gpt_neo"
    attribute_map = {"num_attention_heads": "num_heads", "num_hidden_layers": "num_layers"}
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "h.*.attn.attention.q_proj": "colwise",
        "h.*.attn.attention.k_proj": "colwise_kv",
        "h.*.attn.attention.v_proj": "colwise_kv",
        "h.*.attn.attention.out_proj": "rowwise",
        "h.*.mlp.c_fc": "colwise",
        "h.*.mlp.c_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 50257,
        max_position_embeddings: int = 2048,
        hidden_size: int = 2048,
        num_layers: int = 24,
        attention_types: list | None = None,
        num_heads: int = 16,
        intermediate_size: int | None = None,
        window_size: int = 256,
        activation_function: str = "gelu_new",
        resid_dropout: float = 0.0,
        embed_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        classifier_dropout: float = 0.1,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        bos_token_id: int | None = 50256,
        eos_token_id: int | list[int] | None = 50256,
        pad_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Upstream also accepts the generic names as arguments; popped here so they are not set after (and then
        # overwritten by) GPT-Neo's own fields below.
        num_heads = kwargs.pop("num_attention_heads", num_heads)
        num_layers = kwargs.pop("num_hidden_layers", num_layers)
        kwargs.pop("attention_layers", None)  # derived from attention_types below
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.attention_types = [[["global", "local"], 12]] if attention_types is None else attention_types
        self.attention_layers = self.expand_attention_types_params(self.attention_types)
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size
        self.window_size = window_size
        self.activation_function = activation_function
        self.resid_dropout = resid_dropout
        self.embed_dropout = embed_dropout
        self.attention_dropout = attention_dropout
        self.classifier_dropout = classifier_dropout  # upstream's sequence-classification head; kept for round trips
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.validate()

    @staticmethod
    def expand_attention_types_params(attention_types: list) -> list[str]:
        """`[[["global", "local"], 2]]` -> `["global", "local", "global", "local"]`."""
        return [kind for kinds, repeats in attention_types for _ in range(repeats) for kind in kinds]

    @property
    def layer_types(self) -> list[str]:
        """Each layer's mask kind: `full_attention` for a global layer, `sliding_attention` for a local one."""
        return [LAYER_KINDS[kind] for kind in self.attention_layers]

    @property
    def sliding_window(self) -> int:
        """The keys a local layer sees: `window_size`."""
        return self.window_size

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if len(self.attention_layers) != self.num_layers:
            raise ValueError(
                f"attention_types {self.attention_types} expand to {len(self.attention_layers)} layers, but "
                f"num_layers is {self.num_layers}: they must list one kind per layer"
            )
        unknown = sorted(set(self.attention_layers) - set(LAYER_KINDS))
        if unknown:
            raise ValueError(f"attention_types may only hold 'global' and 'local' layers, got {unknown}")
        if "local" in self.attention_layers and self.window_size < 1:
            raise ValueError(f"window_size must be a positive number of keys, got {self.window_size}")
