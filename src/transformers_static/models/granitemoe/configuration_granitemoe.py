# Generated from modular_granitemoe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""GraniteMoe (Granite 3.x MoE, PowerMoE): Granite (its embedding, attention, residual and logits multipliers) with
every MLP a sparse block: a router picks `num_experts_per_tok` of `num_local_experts` experts per token, the top-k
of its logits (float32) with a softmax over those k alone (upstream's order; the same weights as a softmax over all
experts renormalised over the chosen), and the token's output is their weighted sum.

The experts are stacked parameters (`block_sparse_moe.experts.gate_up_proj` `[experts, 2 * intermediate, hidden]`,
gate rows then up rows, `block_sparse_moe.experts.down_proj` `[experts, hidden, intermediate]`, as upstream 5.x
holds them), run as one static graph for every routing (moe_utils). Checkpoints keep upstream's saved layout:
`block_sparse_moe.input_linear.weight`, `block_sparse_moe.output_linear.weight` (the same stacks) and
`block_sparse_moe.router.layer.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class GraniteMoeConfig(PretrainedConfig):
    """Granite's fields (its four multipliers; no `mlp_bias`, as upstream) plus the experts: `num_local_experts`
    SwiGLU experts of width `intermediate_size` in every layer, `num_experts_per_tok` per token; with
    `output_router_logits` the router logits and the load-balancing loss (times `router_aux_loss_coef` in the
    loss) are returned."""

    model_type = "granitemoe"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # Every expert's intermediate features are split (the routing is replicated), the experts' sums all-reduced.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.block_sparse_moe.experts": "experts",
    }

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        residual_multiplier: float = 1.0,
        attention_multiplier: float = 1.0,
        num_local_experts: int = 8,
        num_experts_per_tok: int = 2,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
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
        if not 0 < num_experts_per_tok <= num_local_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
                f"({num_local_experts}): each token is routed to that many experts"
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
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.residual_multiplier = residual_multiplier
        self.attention_multiplier = attention_multiplier
        self.num_local_experts = num_local_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef

    @property
    def head_dim(self) -> int:
        """`hidden_size // num_attention_heads`, unless the config sets a `head_dim` (upstream has no such field but
        its attention and rotary read one when config.json holds it; it is saved only when set)."""
        return self.__dict__.get("head_dim") or self.hidden_size // self.num_attention_heads

    @head_dim.setter
    def head_dim(self, value: int | None) -> None:
        self.__dict__["head_dim"] = value
