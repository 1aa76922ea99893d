"""StableLM configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class StableLmConfig(PretrainedConfig):
    """StableLM (stablelm-3b-4e1t, StableLM 2). The share of each head that rotates lives, as upstream 5.x stores it,
    in `rope_parameters["partial_rotary_factor"]` (0.25 by default); the top-level `partial_rotary_factor`,
    `rope_theta` and `rope_scaling` of released config.json files are folded in there, the dict's own value first."""

    model_type = "stablelm"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # The per-head q/k LayerNorms are replicated; each rank applies its own heads' norms (config.tp_heads).
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
        intermediate_size: int = 6912,
        hidden_size: int = 2560,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int = 32,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        use_qkv_bias: bool = False,
        qk_layernorm: bool = False,
        use_parallel_residual: bool = False,
        hidden_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 0,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.25))
        head_dim = kwargs.pop("head_dim", None)
        super().__init__(
            bos_token_id=bos_token_id, eos_token_id=eos_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
        )
        self.vocab_size = vocab_size
        self.intermediate_size = intermediate_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = rope_parameters
        self.use_qkv_bias = use_qkv_bias
        self.qk_layernorm = qk_layernorm
        self.use_parallel_residual = use_parallel_residual
        self.hidden_dropout = hidden_dropout
        self.attention_dropout = attention_dropout
        self.validate()
        if head_dim is not None and head_dim != self.head_dim:
            raise ValueError(
                f"head_dim ({head_dim}) must be hidden_size // num_attention_heads ({self.head_dim}): StableLM's "
                "attention derives its head size from hidden_size"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_ndims(self) -> int:
        """How many leading dims of each head rotate: `int(head_dim * partial_rotary_factor)`, as upstream."""
        return int(self.head_dim * self.rope_parameters["partial_rotary_factor"])

    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by num_key_value_heads "
                f"({self.num_key_value_heads})"
            )
        factor = self.rope_parameters["partial_rotary_factor"]
        if not 0 < factor <= 1 or self.rotary_ndims % 2 or self.rotary_ndims == 0:
            raise ValueError(
                f"partial_rotary_factor ({factor}) must lie in (0, 1] and give an even, positive rotary_ndims "
                f"int(head_dim ({self.head_dim}) * partial_rotary_factor) = {self.rotary_ndims}: rotary positions "
                "rotate pairs of dims"
            )
