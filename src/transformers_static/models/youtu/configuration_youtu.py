# Generated from modular_youtu.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Youtu-LLM (tencent/Youtu-LLM-2B): DeepSeek-V3's multi-head latent attention, served from a cache of latents with
`kv_b_proj` absorbed (see deepseek_v3), in a dense Llama-style model: a SwiGLU MLP of `intermediate_size` (no
biases) in every layer, the rope dims interleaved or not by `rope_interleave`. Embeddings initialise with
`embedding_initializer_range` (default twice `initializer_range`, itself `2 / sqrt(5 * hidden_size)` by default).
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class YoutuConfig(PretrainedConfig):
    """Llama's fields with multi-head latent attention (`kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`,
    `qk_rope_head_dim`, `v_head_dim`, `rope_interleave`) and no experts; `head_dim` is `qk_rope_head_dim`, as
    upstream sets it. `initializer_range` None: `2 / sqrt(5 * hidden_size)` (0.02 for a zero width);
    `embedding_initializer_range` None (or 0): twice `initializer_range`.

    Refused: fewer `num_key_value_heads` than heads (MLA has no key/value heads to group; upstream's kernels fail on
    the shapes) and a `partial_rotary_factor` other than 1 (upstream's rotary tables would not fit the rope dims)."""

    model_type = "youtu"
    attribute_map = {}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 128256,
        hidden_size: int = 2048,
        intermediate_size: int = 6144,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 16,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = 1536,
        qk_rope_head_dim: int = 64,
        v_head_dim: int | None = 128,
        qk_nope_head_dim: int = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float | None = None,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 128000,
        eos_token_id: int | list[int] | None = 128001,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        rope_interleave: bool | None = True,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        embedding_initializer_range: float | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        for derived in ("head_dim", "qk_head_dim"):
            kwargs.pop(derived, None)  # derived below, as upstream (a saved config.json holds them)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
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
        if initializer_range is None:
            initializer_range = 2.0 / (5.0 * hidden_size) ** 0.5 if hidden_size else 0.02
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.embedding_initializer_range = embedding_initializer_range or 2.0 * initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_parameters = rope_parameters
        self.rope_interleave = rope_interleave
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension

    def kv_cache_shape(self, layer_idx: int) -> tuple[int, int, int]:
        """One key "head" per token: the normed latent then the rope key (`kv_lora_rank + qk_rope_head_dim`), and no
        value slots (the value is the latent, the key's first `kv_lora_rank` dims)."""
        return 1, self.kv_lora_rank + self.qk_rope_head_dim, 0

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """No layer routes to experts: every MLP is dense."""
        return False
