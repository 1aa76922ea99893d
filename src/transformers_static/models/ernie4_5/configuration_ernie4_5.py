# Generated from modular_ernie4_5.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Ernie 4.5 (Baidu, dense): Llama with rotary positions over INTERLEAVED pairs of each head (dims 2i, 2i + 1),
cos/sin kept in float32 and the rotation computed in float32, and one `use_bias` switch for every projection
(attention q/k/v/o and MLP gate/up/down)."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class Ernie4_5Config(PretrainedConfig):
    """Upstream's fields and defaults (ERNIE-4.5-0.3B's sizes, rope_theta 500000, `head_dim` 128 unless given as
    None); `use_bias` for every projection; no `attention_bias`, `mlp_bias`, `attention_dropout` or
    `pretraining_tp`, as upstream (its attention never drops out)."""

    model_type = "ernie4_5"
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
        vocab_size: int = 103424,
        hidden_size: int = 1024,
        intermediate_size: int = 3072,
        num_hidden_layers: int = 18,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 2,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        use_bias: bool = False,
        head_dim: int | None = 128,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=500000.0
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
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
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.use_bias = use_bias
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
