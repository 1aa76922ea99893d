# Generated from modular_minicpm3.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""MiniCPM3 (openbmb/MiniCPM3-4B): DeepSeek's multi-head latent attention, served from a cache of latents with
`kv_b_proj` absorbed (see deepseek_v3), in a dense Llama-style model with MiniCPM's three scalings.

Attention: as DeepSeek-V2/V3's (queries directly or through `q_lora_rank`, one latent of `kv_lora_rank` and one rope
key of `qk_rope_head_dim` per token, all the cache holds), with the plain rotate-half rope (never interleaved).
MLP: SwiGLU of `intermediate_size`, biased with `mlp_bias`, in every layer.
Scalings: token embeddings times `scale_emb` (embeddings given as `inputs_embeds` are not scaled, as upstream's);
each block's attention and MLP outputs times `scale_depth / sqrt(num_hidden_layers)` before the residual; logits
divided by `hidden_size / dim_model_base` (`logits_scaling`; upstream divides the hidden states before the head,
the same product).
"""

from __future__ import annotations

import math
from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class MiniCPM3Config(PretrainedConfig):
    """Llama's fields with multi-head latent attention (`kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`,
    `qk_rope_head_dim`, `v_head_dim`, default `hidden_size // num_attention_heads`) and MiniCPM's scalings:
    `scale_emb` (embeddings), `scale_depth` (residual branches times `scale_depth / sqrt(num_hidden_layers)`; None:
    `sqrt(num_hidden_layers)`, no scaling) and `dim_model_base` (logits divided by `hidden_size / dim_model_base`;
    None: `hidden_size`, no scaling). `head_dim` is always `qk_rope_head_dim`, as upstream sets it, whatever is given.

    Refused: a `hidden_size` not divisible by `num_attention_heads` (upstream's validation), fewer
    `num_key_value_heads` than heads (MLA has no key/value heads to group; upstream's kernels fail on the shapes),
    a `partial_rotary_factor` other than 1 (upstream's rotary tables would not fit the rope dims), and rope types
    this model's rotary embedding does not compute (longrope among them), by the rope helpers."""

    model_type = "minicpm3"
    attribute_map = {}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 73448,
        hidden_size: int = 2560,
        intermediate_size: int = 6400,
        num_hidden_layers: int = 62,
        num_attention_heads: int = 40,
        num_key_value_heads: int | None = 40,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.1,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        pretraining_tp: int | None = 1,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        head_dim: int | None = None,
        kv_lora_rank: int = 256,
        q_lora_rank: int | None = 768,
        qk_nope_head_dim: int = 64,
        qk_rope_head_dim: int = 32,
        v_head_dim: int | None = None,
        scale_emb: float = 12,
        scale_depth: float | None = 1.4,
        dim_model_base: int | None = 256,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        for derived in ("qk_head_dim", "rope_interleave"):
            kwargs.pop(derived, None)  # derived (or fixed) here, as upstream
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads}), as upstream's MiniCPM3Config requires"
            )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_key_value_heads < num_attention_heads:
            raise ValueError(
                f"num_key_value_heads={num_key_value_heads} with num_attention_heads={num_attention_heads}: latent "
                "attention has no key/value heads to group (every head reads the one cached latent); upstream's "
                "kernels fail on the shapes with fewer key/value heads than heads"
            )
        partial_rotary_factor = rope_parameters.get("partial_rotary_factor", 1.0)
        if partial_rotary_factor != 1.0:
            raise ValueError(
                f"partial_rotary_factor={partial_rotary_factor}: the rope covers all qk_rope_head_dim dims of latent "
                "attention (upstream's rotary tables would not fit them)"
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
        self.use_cache = use_cache
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = hidden_size // num_attention_heads if v_head_dim is None else v_head_dim
        self.scale_emb = scale_emb
        self.scale_depth = math.sqrt(num_hidden_layers) if scale_depth is None else scale_depth
        self.dim_model_base = hidden_size if dim_model_base is None else dim_model_base
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension, whatever `head_dim` says
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim

    def kv_cache_shape(self, layer_idx: int) -> tuple[int, int, int]:
        """One key "head" per token: the normed latent then the rope key (`kv_lora_rank + qk_rope_head_dim`), and no
        value slots (the value is the latent, the key's first `kv_lora_rank` dims)."""
        return 1, self.kv_lora_rank + self.qk_rope_head_dim, 0

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """No layer routes to experts: every MLP is dense."""
        return False

    rope_interleave = False  # MiniCPM3 rotates the rope dims in halves (not a field of upstream's config)

    @property
    def logits_scaling(self) -> float:
        """The logits' divisor, `hidden_size / dim_model_base` (1 when they are equal)."""
        return self.hidden_size / self.dim_model_base
