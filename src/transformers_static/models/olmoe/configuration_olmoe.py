# Generated from modular_olmoe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""OLMoE (OLMoE-1B-7B): Llama's pre-norm blocks with OLMo 2's query/key RMSNorms over the whole projections (all
heads at once, before the split into heads and the rotary positions), OLMo's optional `clip_qkv` (the normed query
and key and the value clamped to `[-clip_qkv, clip_qkv]`), and a sparse MLP on every layer: a router picks
`num_experts_per_tok` of `num_experts` experts of width `intermediate_size` per token (softmax over all experts,
renormalised over the chosen ones only with `norm_topk_prob`). No dense layers, no shared expert, no window.

The experts are stacked parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class OlmoeConfig(PretrainedConfig):
    """Llama's fields with OLMoE's defaults, `clip_qkv` (None, or a positive bound on every query, key and value
    element) and the expert fields: `num_experts` experts (also read as `num_local_experts`) of width
    `intermediate_size` on every layer, `num_experts_per_tok` per token, renormalised when `norm_topk_prob`.

    As upstream: `head_dim` is not a field (the q/k norms are sized `hidden_size` and `hidden_size //
    num_attention_heads * num_key_value_heads`, so a config.json's other `head_dim` is refused), and a
    `sliding_window` is refused (upstream's mask ignores it; only its flash-attention kernel would apply it)."""

    model_type = "olmoe"
    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 2048,
        intermediate_size: int = 2048,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 50279,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        clip_qkv: float | None = None,
        num_experts_per_tok: int = 8,
        num_experts: int = 64,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.01,
        norm_topk_prob: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        if kwargs.get("sliding_window") is not None:
            raise ValueError(
                f"sliding_window={kwargs['sliding_window']} is not supported for olmoe: upstream's eager and sdpa "
                "masks ignore it (only its flash-attention kernel would apply it), so no answer here is upstream's"
            )
        if kwargs.get("head_dim") not in (None, hidden_size // num_attention_heads):
            raise ValueError(
                f"head_dim={kwargs['head_dim']} is not supported for olmoe: upstream sizes its q/k norms by "
                f"hidden_size // num_attention_heads ({hidden_size // num_attention_heads})"
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
        _check_experts(num_experts_per_tok, num_experts)
        if clip_qkv is not None and not clip_qkv > 0:
            raise ValueError(f"clip_qkv ({clip_qkv}) must be None or positive")
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
        self.clip_qkv = clip_qkv
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
