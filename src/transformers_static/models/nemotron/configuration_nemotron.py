# Generated from modular_nemotron.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Nemotron (Nemotron-3, Minitron): Llama with LayerNorm1P (a LayerNorm with bias whose scale is `weight + 1`), a
gate-free ReLU² MLP (`up_proj`, `down_proj`) and rotary positions on the leading `partial_rotary_factor` share of
each head (half by default)."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class NemotronConfig(PretrainedConfig):
    """Upstream's fields and defaults (nemotron-15b's sizes): `norm_eps` for the LayerNorms, no `rms_norm_eps`
    or `pretraining_tp`. The rotated share of each head lives, as upstream 5.x keeps it, in
    `rope_parameters["partial_rotary_factor"]` (0.5 unless given there or at the top level, as older config.json
    files have it)."""

    model_type = "nemotron"
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 256000,
        hidden_size: int = 6144,
        intermediate_size: int = 24576,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 48,
        head_dim: int | None = None,
        num_key_value_heads: int | None = None,
        hidden_act: str = "relu2",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.0134,
        norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 2,
        eos_token_id: int | list[int] | None = 3,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        # upstream: the dict's own value wins over the top-level field, which defaults to a half
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.5))
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
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
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.norm_eps = norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        factor = rope_parameters["partial_rotary_factor"]
        rotary_ndims = int(self.head_dim * factor)  # the leading dims of each head that rotate, as upstream
        if not 0 < factor <= 1 or rotary_ndims % 2 or rotary_ndims == 0:
            raise ValueError(
                f"partial_rotary_factor ({factor}) must lie in (0, 1] and give an even, positive rotary_ndims "
                f"int(head_dim ({self.head_dim}) * partial_rotary_factor) = {rotary_ndims}: rotary positions "
                "rotate pairs of dims"
            )
