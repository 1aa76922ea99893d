"""Phi configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class PhiConfig(PretrainedConfig):
    """Phi-1 / Phi-1.5 / Phi-2. The share of each head that is rotated lives, as upstream 5.x writes it, in
    `rope_parameters["partial_rotary_factor"]`; the older top-level `partial_rotary_factor` (and `rope_theta`,
    `rope_scaling`) that released checkpoints carry are folded in there, the dict's own value first."""

    model_type = "phi"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.dense": "rowwise",
        "layers.*.mlp.fc1": "colwise",
        "layers.*.mlp.fc2": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 51200,
        hidden_size: int = 2048,
        intermediate_size: int = 8192,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        resid_pdrop: float = 0.0,
        embd_pdrop: float = 0.0,
        attention_dropout: float = 0.0,
        hidden_act: str = "gelu_new",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        rope_parameters: dict[str, Any] | None = None,
        qk_layernorm: bool = False,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.5))
        super().__init__(
            bos_token_id=bos_token_id, eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
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
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attention_dropout = attention_dropout
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = rope_parameters
        self.qk_layernorm = qk_layernorm
        self._check_rotary_dim()

    def _check_rotary_dim(self) -> None:
        factor = self.rope_parameters["partial_rotary_factor"]
        dim = rotary_ndims(self)
        if not 0.0 < factor <= 1.0 or dim == 0 or dim % 2:
            raise ValueError(
                f"partial_rotary_factor ({factor}) must be in (0, 1] and give an even, positive rotary_ndims "
                f"int(head_dim * partial_rotary_factor), got {dim} (rotation pairs dim i with dim i + rotary_ndims / 2)"
            )


def head_dim(config: PhiConfig) -> int:
    """Dims per head: `hidden_size // num_attention_heads` unless a config.json sets `head_dim`."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_ndims(config: PhiConfig) -> int:
    """Rotated dims per head (the leading ones): `int(head_dim * partial_rotary_factor)`, truncated as upstream."""
    return int(head_dim(config) * config.rope_parameters["partial_rotary_factor"])
