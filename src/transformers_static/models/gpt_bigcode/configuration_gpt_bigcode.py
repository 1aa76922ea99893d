"""GPTBigCode (StarCoder 1, SantaCoder) configuration, with upstream's field names (`n_embd`, `n_head`, ...) and
defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig


class GPTBigCodeConfig(PretrainedConfig):
    """Configuration of a GPTBigCode model: GPT-2's fields plus `multi_query` (one key/value head shared by all
    query heads, the default). The generic names (`hidden_size`, `num_attention_heads`, `num_hidden_layers`,
    `max_position_embeddings`) are aliases of its own, read and written through `attribute_map`, and are accepted
    as constructor arguments too.

    `num_key_value_heads` is derived from `multi_query` (1, else `n_head`) and saved, as upstream does; a value read
    from config.json is replaced by it. `attention_softmax_in_fp32` and `scale_attention_softmax_in_fp32` are kept
    for round trips only: upstream 5.23 reads neither (its softmax is always in float32, after the scaling), and
    neither does this library's.
    """

    model_type = "gpt_bigcode"
    attribute_map = {
        "hidden_size": "n_embd",
        "max_position_embeddings": "n_positions",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # c_attn is laid out `[kv_heads, q_per_kv + 2, head_dim]` (multi-query: all queries, one key, one value; else
    # per head its query, key and value), Falcon's layout.
    base_model_tp_plan = {
        "h.*.attn.c_attn": "colwise_qkv_groups",
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
        activation_function: str = "gelu_pytorch_tanh",
        resid_pdrop: float = 0.1,
        embd_pdrop: float = 0.1,
        attn_pdrop: float = 0.1,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        scale_attn_weights: bool = True,
        bos_token_id: int | None = 50256,
        eos_token_id: int | list[int] | None = 50256,
        pad_token_id: int | None = None,
        attention_softmax_in_fp32: bool = True,
        scale_attention_softmax_in_fp32: bool = True,
        multi_query: bool = True,
        add_cross_attention: bool = False,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Upstream also accepts the generic names as arguments; popped here so they are not set after (and then
        # overwritten by) the model's own fields below.
        n_embd = kwargs.pop("hidden_size", n_embd)
        n_head = kwargs.pop("num_attention_heads", n_head)
        n_layer = kwargs.pop("num_hidden_layers", n_layer)
        n_positions = kwargs.pop("max_position_embeddings", n_positions)
        kwargs.pop("num_key_value_heads", None)  # derived from multi_query below
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
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
        self.scale_attn_weights = scale_attn_weights
        self.attention_softmax_in_fp32 = attention_softmax_in_fp32
        self.scale_attention_softmax_in_fp32 = scale_attention_softmax_in_fp32
        self.multi_query = multi_query
        self.add_cross_attention = add_cross_attention
        self.num_key_value_heads = 1 if multi_query else n_head
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.num_key_value_heads != (1 if self.multi_query else self.n_head):
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must be 1 with multi_query=True, else n_head "
                f"({self.n_head}): GPTBigCode has no grouped heads (set multi_query instead)"
            )
        if self.add_cross_attention:
            raise ValueError(
                "add_cross_attention=True is not supported: GPTBigCode here is a decoder-only causal LM "
                "(upstream's cross-attention layers for encoder-decoder use are out of scope)"
            )
