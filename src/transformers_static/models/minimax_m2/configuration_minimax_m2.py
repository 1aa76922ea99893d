# Generated from modular_minimax_m2.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""MiniMax-M2: Mixtral's pre-norm blocks and experts (`block_sparse_moe.experts.{e}.w1/w2/w3` in checkpoints) with
a sigmoid router: each expert scored by the sigmoid of its logit, the `num_experts_per_tok` best chosen by those
scores plus `e_score_correction_bias` (a per-expert buffer of each sparse block, saved as
`block_sparse_moe.e_score_correction_bias`), weighted by their unbiased scores renormalised to sum to 1. The
attention has RMSNorms over the whole query and key projections (all heads at once, before the split into heads)
and rotary positions on the leading `int(head_dim * partial_rotary_factor)` dims of each head (the released
checkpoints' `rotary_dim`). No window, no biases.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class MiniMaxM2Config(PretrainedConfig):
    """Mixtral's fields with MiniMax-M2's defaults (`head_dim` 128, 8 of 256 experts, rope_theta 5e6) and partial
    rotary positions: `rope_parameters["partial_rotary_factor"]`, else a top-level `partial_rotary_factor`, else
    the released checkpoints' `rotary_dim / head_dim` (as upstream).

    As upstream: a `sliding_window` is dropped (upstream's mask and attention never read it) and
    `router_jitter_noise` scales the experts' input by uniform noise while training only."""

    model_type = "minimax_m2"
    attribute_map = {"num_experts": "num_local_experts"}

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them. The query/key norms need the whole projections: q_proj and k_proj stay replicated (every rank
        computes them and their norms, then keeps its heads), v_proj and o_proj split by heads; every expert's
        intermediate features are split (the routing is replicated), the experts' sums all-reduced."""
        return {
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.mlp.experts": "experts",
        }

    def __init__(
        self,
        vocab_size: int = 200064,
        hidden_size: int = 3072,
        intermediate_size: int = 1536,
        num_hidden_layers: int = 62,
        num_attention_heads: int = 48,
        num_key_value_heads: int | None = 8,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 196608,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 200034,
        eos_token_id: int | list[int] | None = 200020,
        tie_word_embeddings: bool = False,
        attention_dropout: float = 0.0,
        num_experts_per_tok: int = 8,
        num_local_experts: int = 256,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        router_jitter_noise: float = 0.0,
        rope_parameters: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=5e6
        )
        num_local_experts = kwargs.pop("num_experts", num_local_experts)
        kwargs.pop("sliding_window", None)  # never read upstream: every layer attends to the whole causal prefix
        factor = kwargs.pop("partial_rotary_factor", None)
        rotary_dim = kwargs.get("rotary_dim")
        the_head_dim = head_dim or hidden_size // num_attention_heads
        if factor is None and rotary_dim is not None:
            factor = rotary_dim / the_head_dim
        if factor is not None:
            rope_parameters.setdefault("partial_rotary_factor", factor)
        rotary_ndims = int(the_head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
        if not 0 < rotary_ndims <= the_head_dim or rotary_ndims % 2:
            raise ValueError(
                f"partial_rotary_factor ({rope_parameters['partial_rotary_factor']}) must give an even rotary_ndims "
                f"int(head_dim ({the_head_dim}) * partial_rotary_factor) = {rotary_ndims} between 2 and head_dim"
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
        _check_experts(num_experts_per_tok, num_local_experts)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.attention_dropout = attention_dropout
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_local_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.router_jitter_noise = router_jitter_noise
        self.rope_parameters = rope_parameters


def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )
