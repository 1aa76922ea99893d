"""CPM-Ant configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig

# the prompt upstream's forward prepends (of its prompt_types): ids vocab_size + 2 * prompt_length, ...
PROMPT_TYPE = 2
INPUT_SEGMENT = 2  # the segment of every input token (the prompt's is 0)


class CpmAntConfig(PretrainedConfig):
    """CPM-Ant: `dim_head` per head (not `hidden_size // num_attention_heads`), a gated-GELU FFN of `dim_ff`, a
    relative position bias of `position_bias_num_buckets` buckets up to `position_bias_max_distance` plus one bucket
    per segment pair (`segment_types`), and a learned prompt of `prompt_length` tokens (`prompt_types` of them in
    the embedding table) before every sequence. `tie_word_embeddings` is True by default, as upstream, but nothing
    is tied there either: the head is `vocab_size` wide, the input embeddings also hold the prompts'."""

    model_type = "cpmant"

    def __init__(
        self,
        vocab_size: int = 30720,
        hidden_size: int = 4096,
        num_attention_heads: int = 32,
        dim_head: int = 128,
        dim_ff: int = 10240,
        num_hidden_layers: int = 48,
        dropout_p: float = 0.0,
        position_bias_num_buckets: int = 512,
        position_bias_max_distance: int = 2048,
        eps: float = 1e-6,
        init_std: float = 1.0,
        prompt_types: int = 32,
        prompt_length: int = 32,
        segment_types: int = 32,
        use_cache: bool = True,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(use_cache=use_cache, tie_word_embeddings=tie_word_embeddings, **kwargs)
        if prompt_types <= PROMPT_TYPE:
            raise ValueError(
                f"prompt_types={prompt_types}: CPM-Ant's forward prepends the prompt of type {PROMPT_TYPE}, so "
                f"prompt_types must be at least {PROMPT_TYPE + 1}"
            )
        if segment_types <= INPUT_SEGMENT:
            raise ValueError(
                f"segment_types={segment_types}: CPM-Ant's input tokens are of segment {INPUT_SEGMENT}, so "
                f"segment_types must be at least {INPUT_SEGMENT + 1}"
            )
        if position_bias_num_buckets < 4 or position_bias_max_distance <= position_bias_num_buckets // 4:
            raise ValueError(
                f"position_bias_num_buckets={position_bias_num_buckets}, position_bias_max_distance="
                f"{position_bias_max_distance}: need at least 4 buckets and a max distance beyond a quarter of them "
                "(the exactly bucketed distances)"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.dim_head = dim_head
        self.dim_ff = dim_ff
        self.num_hidden_layers = num_hidden_layers
        self.dropout_p = dropout_p
        self.position_bias_num_buckets = position_bias_num_buckets
        self.position_bias_max_distance = position_bias_max_distance
        self.eps = eps
        self.init_std = init_std
        self.prompt_types = prompt_types
        self.prompt_length = prompt_length
        self.segment_types = segment_types

    @property
    def head_dim(self) -> int:
        """The cache's per-head width (`dim_head`)."""
        return self.dim_head
