# Generated from modular_glm4.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""GLM-4 (THUDM/GLM-4-9B-0414): GLM's layers (fused `gate_up_proj` MLP, interleaved partial rotary, q/k/v biases)
with two more RMSNorms per layer, on the attention output (`post_self_attn_layernorm`) and on the MLP output
(`post_mlp_layernorm`), each applied before its residual add."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class Glm4Config(PretrainedConfig):
    """Upstream's fields and defaults (GLM-4-9B-0414's sizes), as GLM's: the rotated share of each head in
    `rope_parameters["partial_rotary_factor"]` (0.5 unless given there or at the top level); `eos_token_id` None
    means upstream's three stop tokens."""

    model_type = "glm4"
    # Tensor parallelism (integrations/tensor_parallel.py): heads split as Llama's, the fused MLP by gate/up blocks.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_up_proj": "colwise_gate_up",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 151552,
        hidden_size: int = 4096,
        intermediate_size: int = 13696,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 2,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        attention_dropout: float = 0.0,
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1.5625e-07,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        pad_token_id: int | None = 151329,
        eos_token_id: int | list[int] | None = None,
        bos_token_id: int | None = None,
        attention_bias: bool = True,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        # upstream: the dict's own value wins over the top-level field, which defaults to a half
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.5))
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=[151329, 151336, 151338] if eos_token_id is None else eos_token_id,
            pad_token_id=pad_token_id,
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
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.attention_dropout = attention_dropout
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        factor = rope_parameters["partial_rotary_factor"]
        rotary_ndims = int(self.head_dim * factor)  # the leading dims of each head that rotate, as upstream
        if not 0 < factor <= 1 or rotary_ndims % 2 or rotary_ndims == 0:
            raise ValueError(
                f"partial_rotary_factor ({factor}) must lie in (0, 1] and give an even, positive rotary_ndims "
                f"int(head_dim ({self.head_dim}) * partial_rotary_factor) = {rotary_ndims}: rotary positions "
                "rotate pairs of dims"
            )
