# Generated from modular_hrm_text.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""HRM-Text: a dense decoder of two stacks, a low-level (L) and a high-level (H) one, looped over depth. Per token:
`z_H` starts at the scaled embeddings and `z_L` at the learned `z_L_init`; each of `H_cycles` cycles runs the L stack
`L_cycles` times on `z_L + z_H`, then the H stack once on `z_H + z_L`. Every stack ends in a weight-free RMSNorm,
attention is multi-head with a sigmoid output gate (`gate_proj`), and every invocation of a layer keeps its own
keys/values: cache layer `(h * (L_cycles + 1) + l) * num_layers_per_stack + layer` (the H stack at `l = L_cycles`),
`config.num_hidden_layers` of them in all, as upstream."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class HrmTextConfig(PretrainedConfig):
    """Upstream's fields and defaults: Llama's without `num_key_value_heads` (multi-head attention) and
    `pretraining_tp`, plus the loop (`H_cycles`, `L_cycles`, `L_bp_cycles`: which L cycles of each H cycle carry
    gradients in training), `embedding_scale` (default `1 / initializer_range`) and `prefix_lm`.

    As upstream, `num_hidden_layers` counts cache layers: on first construction (no `num_layers_per_stack`) the
    given value is the real layer count of each stack, kept as `num_layers_per_stack`, and `num_hidden_layers`
    becomes `num_layers_per_stack * H_cycles * (L_cycles + 1)`; a saved config holds both and loads unchanged."""

    model_type = "hrm_text"
    # No tensor-parallel plan: the checkpoint fuses gate, q, k and v in one tensor per layer (`attn.gqkv_proj`),
    # so a rank cannot read its heads' rows by module name; `tp_plan="auto"` is refused.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 151808,
        hidden_size: int = 1536,
        intermediate_size: int = 4096,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 12,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        head_dim: int = 128,
        H_cycles: int = 2,
        L_cycles: int = 3,
        L_bp_cycles: list[int] | None = None,
        embedding_scale: float | None = None,
        prefix_lm: bool = True,
        num_layers_per_stack: int | None = None,
        **kwargs: Any,
    ) -> None:
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
            )
        if H_cycles < 1 or L_cycles < 0:
            raise ValueError(f"H_cycles ({H_cycles}) must be >= 1 and L_cycles ({L_cycles}) >= 0")
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
        if num_layers_per_stack is None:  # first construction: `num_hidden_layers` is the real per-stack count
            num_layers_per_stack = num_hidden_layers
            num_hidden_layers = num_layers_per_stack * H_cycles * (L_cycles + 1)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.head_dim = head_dim
        self.H_cycles = H_cycles
        self.L_cycles = L_cycles
        self.L_bp_cycles = [2] if L_bp_cycles is None else list(L_bp_cycles)
        self.embedding_scale = 1.0 / initializer_range if embedding_scale is None else embedding_scale
        self.prefix_lm = prefix_lm
        self.num_layers_per_stack = num_layers_per_stack
