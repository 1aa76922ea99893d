# Generated from modular_flex_olmo.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""FlexOlmo (FlexOlmo-7x7B-1T): OLMoE's sparse MLP on every layer (a softmax router picks `num_experts_per_tok` of
`num_experts` experts of width `intermediate_size` per token, renormalised over the chosen ones only with
`norm_topk_prob`) in OLMo 2's blocks: each sublayer reads the raw residual stream and its output is RMSNormed before
it is added back (`post_attention_layernorm`, `post_feedforward_layernorm`; no input norm), queries and keys are
RMSNormed over their whole projections (all heads at once, before the split into heads and the rotation), and the
norms and the rotation are computed in float32 and cast back afterwards, as OLMo 2. No `clip_qkv`, no window.

The experts are stacked parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class FlexOlmoConfig(PretrainedConfig):
    """Llama's fields with FlexOlmo's defaults (OLMo 2's vocabulary and tokens, rope_theta 500000, 5 of 7 experts)
    and the expert fields: `num_experts` experts (also read as `num_local_experts`) of width `intermediate_size` on
    every layer, `num_experts_per_tok` per token, renormalised when `norm_topk_prob`.

    As upstream: `head_dim` is not a field, but a config.json's `head_dim` sizes the heads (and the q/k norms,
    `heads * head_dim`); a `sliding_window` is dropped (upstream's attention never reads it, not even for flash
    attention) and a `clip_qkv` is kept but never applied (upstream's FlexOlmo attention has no clamp)."""

    model_type = "flex_olmo"
    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 100352,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = 100277,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 100257,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        num_experts_per_tok: int = 5,
        num_experts: int = 7,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.01,
        norm_topk_prob: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters,
            kwargs.pop("rope_theta", None),
            kwargs.pop("rope_scaling", None),
            default_theta=500000.0,
        )
        kwargs.pop("sliding_window", None)  # never read upstream: every layer attends to the whole causal prefix
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
        _check_experts(num_experts_per_tok, num_experts)
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
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.norm_topk_prob = norm_topk_prob

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

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Every layer routes to experts."""
        return True


def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )
