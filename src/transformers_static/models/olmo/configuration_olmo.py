# Generated from modular_olmo.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""OLMo: Llama with non-parametric LayerNorms (no weight, no bias), bias-free MLP, float32 rotary tables and
optional `clip_qkv` clamping of the query/key/value projections."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class OlmoConfig(PretrainedConfig):
    """Llama's fields without `rms_norm_eps`, `mlp_bias`, `pretraining_tp` and `head_dim` (heads are
    `hidden_size // num_attention_heads`), with OLMo's defaults and `clip_qkv`: when set, every element of the query,
    key and value projections is clamped to `[-clip_qkv, clip_qkv]`."""

    model_type = "olmo"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 50279,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        clip_qkv: float | None = None,
        **kwargs: Any,
    ) -> None:
        given_head_dim = kwargs.pop("head_dim", None)
        if given_head_dim is not None and given_head_dim != hidden_size // num_attention_heads:
            raise ValueError(
                f"head_dim ({given_head_dim}) must be hidden_size // num_attention_heads "
                f"({hidden_size // num_attention_heads}): OLMo has no head_dim field of its own"
            )
        if clip_qkv is not None and not clip_qkv > 0:
            raise ValueError(f"clip_qkv ({clip_qkv}) must be None or positive")
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.clip_qkv = clip_qkv

    # Not a config.json field (as upstream): always `hidden_size // num_attention_heads`.
    head_dim = property(lambda self: self.hidden_size // self.num_attention_heads)
