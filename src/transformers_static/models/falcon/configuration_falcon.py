"""Falcon configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class FalconConfig(PretrainedConfig):
    """Configuration of a Falcon model.

    The attention has one of three key/value layouts, all packed in `query_key_value` as
    `[kv_heads, heads // kv_heads + 2, head_dim]` (each group's queries, then its key, then its value):
    `new_decoder_architecture` (Falcon-40B/180B: `num_kv_heads` groups), `multi_query` (Falcon-7B: one key/value
    head), or neither (one key/value per head). Positions are rotary, or ALiBi biases when `alibi=True`.
    """

    model_type = "falcon"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "h.*.self_attention.query_key_value": "colwise_qkv_groups",
        "h.*.self_attention.dense": "rowwise",
        "h.*.mlp.dense_h_to_4h": "colwise",
        "h.*.mlp.dense_4h_to_h": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 65024,
        hidden_size: int = 4544,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 71,
        num_ln_in_parallel_attn: int | None = None,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        hidden_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        num_kv_heads: int | None = None,
        alibi: bool = False,
        new_decoder_architecture: bool = False,
        multi_query: bool = True,
        parallel_attn: bool = True,
        bias: bool = False,
        max_position_embeddings: int = 2048,
        rope_parameters: dict[str, Any] | None = None,
        bos_token_id: int | None = 11,
        eos_token_id: int | list[int] | None = 11,
        pad_token_id: int | None = None,
        ffn_hidden_size: int | None = None,
        activation: str = "gelu",
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        hidden_size = kwargs.pop("n_embed", hidden_size)  # the name of the earliest Falcon configs
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_ln_in_parallel_attn = num_ln_in_parallel_attn
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.hidden_dropout = hidden_dropout
        self.attention_dropout = attention_dropout
        self.num_kv_heads = num_attention_heads if num_kv_heads is None else num_kv_heads
        self.alibi = alibi
        self.new_decoder_architecture = new_decoder_architecture
        self.multi_query = multi_query
        self.parallel_attn = parallel_attn
        self.bias = bias
        self.max_position_embeddings = max_position_embeddings
        self.rope_parameters = rope_parameters
        self.ffn_hidden_size = hidden_size * 4 if ffn_hidden_size is None else ffn_hidden_size
        self.activation = activation
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary(self) -> bool:
        return not self.alibi

    @property
    def num_key_value_heads(self) -> int:
        """Key/value heads the attention (and its cache) holds: `num_kv_heads` groups in the new decoder
        architecture, one for multi-query, else one per query head."""
        if self.new_decoder_architecture:
            return self.num_kv_heads
        return 1 if self.multi_query else self.num_attention_heads

    def validate(self) -> None:
        """Raise a ValueError for a layout upstream cannot build or run (also run at model init, as configs are
        mutable)."""
        heads, kv_heads = self.num_attention_heads, self.num_kv_heads
        if self.hidden_size % heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({heads})")
        if self.new_decoder_architecture and heads % kv_heads:
            raise ValueError(f"num_attention_heads ({heads}) must be divisible by num_kv_heads ({kv_heads})")
        if not self.new_decoder_architecture and not self.multi_query and kv_heads != heads:
            raise ValueError(
                f"num_kv_heads ({kv_heads}) must equal num_attention_heads ({heads}) without multi_query or "
                "new_decoder_architecture (one key/value per head); grouped heads need new_decoder_architecture=True"
            )
        if self.new_decoder_architecture and not self.parallel_attn:
            raise ValueError("new_decoder_architecture=True needs parallel_attn=True (its blocks are parallel)")
        if self.num_ln_in_parallel_attn not in (None, 1, 2):
            raise ValueError(f"num_ln_in_parallel_attn must be None, 1 or 2, got {self.num_ln_in_parallel_attn}")
        if self.num_ln_in_parallel_attn == 2 and self.parallel_attn and not self.new_decoder_architecture:
            raise ValueError("num_ln_in_parallel_attn=2 (ln_attn and ln_mlp) needs new_decoder_architecture=True")
