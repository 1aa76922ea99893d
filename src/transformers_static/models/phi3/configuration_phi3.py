"""Phi-3 configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_longrope_parameters, validate_longrope_parameters


class Phi3Config(PretrainedConfig):
    """Phi-3 / Phi-3.5 / Phi-4-mini. Rotary positions live, as upstream 5.x keeps them, in `rope_parameters`: the
    rotated share of each head (`partial_rotary_factor`, 1 unless given there or at the top level) and the default
    table or LongRoPE (`rope_type="longrope"`: `short_factor` / `long_factor`, one per rotated pair of dims, switched
    at `original_max_position_embeddings`, which the top-level field of that name sets, as upstream; "su" and "yarn",
    older checkpoints' names, mean longrope). `sliding_window` (None: off) applies to every layer."""

    model_type = "phi3"
    # Tensor parallelism (integrations/tensor_parallel.py): each block of the fused projections split by heads /
    # columns, so each rank computes its own heads and MLP columns (upstream instead gathers the fused outputs).
    base_model_tp_plan = {
        "layers.*.self_attn.qkv_proj": "colwise_qkv_blocks",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_up_proj": "colwise_gate_up",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 32064,
        hidden_size: int = 3072,
        intermediate_size: int = 8192,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        resid_pdrop: float = 0.0,
        embd_pdrop: float = 0.0,
        attention_dropout: float = 0.0,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        original_max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 32000,
        pad_token_id: int | None = 32000,
        sliding_window: int | None = None,
        **kwargs: Any,
    ) -> None:
        # Upstream's order: rope_scaling (older checkpoints) before rope_parameters; the top-level partial rotary
        # factor is copied in and also kept as a field, rope_theta moved in.
        rope_parameters = dict(kwargs.pop("rope_scaling", None) or rope_parameters or {})
        rope_parameters.setdefault("rope_theta", kwargs.pop("rope_theta", 10000.0))
        rope_parameters.setdefault("partial_rotary_factor", kwargs.get("partial_rotary_factor", 1.0))
        rope_parameters.setdefault("rope_type", rope_parameters.get("type", "default"))
        if rope_parameters["rope_type"] in ("yarn", "longrope"):
            rope_parameters = standardize_longrope_parameters(
                rope_parameters, original_max_position_embeddings, max_position_embeddings
            )
        if rope_parameters["rope_type"] in ("su", "yarn"):
            rope_parameters["rope_type"] = "longrope"
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
        self.num_key_value_heads = num_key_value_heads
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop  # kept for the round trip: upstream's Phi-3 drops out no embeddings
        self.attention_dropout = attention_dropout
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.original_max_position_embeddings = original_max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.sliding_window = sliding_window
        self._check_rope()

    def _check_rope(self) -> None:
        rope_type = self.rope_parameters["rope_type"]
        if rope_type not in ("default", "longrope"):
            raise ValueError(f"Phi-3's rope_parameters rope_type must be 'default' or 'longrope', got {rope_type!r}")
        # Upstream sizes the factor lists from hidden_size // num_attention_heads (Phi-3 configs state no head_dim).
        share = self.rope_parameters["partial_rotary_factor"]
        validate_longrope_parameters(self.rope_parameters, int(self.hidden_size // self.num_attention_heads * share))
        dim = rotary_ndims(self)
        if not 0.0 < share <= 1.0 or dim == 0 or dim % 2:
            raise ValueError(
                f"partial_rotary_factor ({share}) must be in (0, 1] and give an even, positive rotary_ndims "
                f"int(head_dim * partial_rotary_factor), got {dim} (rotation pairs dim i with dim i + rotary_ndims / 2)"
            )


def head_dim(config: Phi3Config) -> int:
    """Dims per head: `hidden_size // num_attention_heads` unless a config.json sets `head_dim`."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_ndims(config: Phi3Config) -> int:
    """Rotated dims per head (the leading ones): `int(head_dim * partial_rotary_factor)`, truncated as upstream."""
    return int(head_dim(config) * config.rope_parameters["partial_rotary_factor"])
