"""DeepSeek-V2: DeepSeek-V3's multi-head latent attention (served from a cache of latents, `kv_b_proj` absorbed;
see deepseek_v3) with V2's softmax routing and always-interleaved rope.

Routing: softmax over the experts in float32; `topk_method="greedy"` takes the `num_experts_per_tok` best,
`"group_limited_greedy"` the best within the `topk_group` groups (of `n_group`) whose best expert scores highest
(`moe_utils.grouped_top_k`, `group_score="max"`); the weights are the chosen probabilities times
`routed_scaling_factor`, never renormalised (upstream's V2 router ignores `norm_topk_prob`), and no score correction
bias. The dense MLPs (first `first_k_dense_replace` layers, shared experts) have `mlp_bias`. The rope pairs are
interleaved (upstream rotates them as complex numbers), whatever `rope_interleave` a config.json holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...modeling_rope_utils import standardize_rope_parameters
from ...moe_utils import grouped_top_k
from ..deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config, _check_groups
from ..deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Experts,
    DeepseekV3ForCausalLM,
    DeepseekV3MLP,
    DeepseekV3PreTrainedModel,
    DeepseekV3TopkRouter,
)


class DeepseekV2Config(DeepseekV3Config):
    """Multi-head latent attention (as DeepSeek-V3's) and V2's mixture of experts: the first `first_k_dense_replace`
    layers dense (`intermediate_size`, `mlp_bias`), the others `n_routed_experts` experts of
    `moe_intermediate_size` (`num_experts` and `num_local_experts`, upstream's attribute names), `num_experts_per_tok`
    per token by softmax probability (`topk_method`: "greedy", or "group_limited_greedy" within the best `topk_group`
    of `n_group` groups), times `routed_scaling_factor`, plus a shared MLP of `n_shared_experts *
    moe_intermediate_size`. `norm_topk_prob` is accepted and unused, as upstream's V2 router ignores it.

    Refused: another `topk_method` (upstream's router has no weights then), and fewer `num_key_value_heads` than
    heads (MLA has no key/value heads to group; upstream's kernels fail on the shapes). More are unused, as
    upstream's sdpa ignores them."""

    model_type = "deepseek_v2"
    attribute_map = {"num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts"}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None
    rope_interleave = True  # V2's rope pairs are always interleaved (not a field of upstream's config)

    def __init__(
        self,
        vocab_size: int = 102400,
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
        pretraining_tp: int | None = 1,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        first_k_dense_replace: int = 0,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = 1536,
        n_group: int | None = None,
        n_routed_experts: int = 64,
        output_router_logits: bool = False,
        n_shared_experts: int = 2,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        routed_scaling_factor: float = 1.0,
        topk_group: int | None = None,
        topk_method: str | None = "greedy",
        norm_topk_prob: bool | None = False,
        v_head_dim: int = 128,
        num_experts_per_tok: int | None = None,
        moe_intermediate_size: int = 1407,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        n_routed_experts = kwargs.pop("num_experts", kwargs.pop("num_local_experts", n_routed_experts))
        for derived in ("head_dim", "qk_head_dim", "rope_interleave"):
            kwargs.pop(derived, None)  # derived (or fixed) here, as upstream
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
        topk_methods = ("greedy", "group_limited_greedy")
        if topk_method not in topk_methods:
            raise ValueError(
                f"topk_method={topk_method!r} is not one of DeepSeek-V2's {topk_methods} (upstream's router computes "
                "no expert weights for it)"
            )
        if n_routed_experts and first_k_dense_replace < num_hidden_layers:
            if not num_experts_per_tok or not 0 < num_experts_per_tok <= n_routed_experts:
                raise ValueError(
                    f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and n_routed_experts "
                    f"({n_routed_experts}): each token is routed to that many experts"
                )
            if topk_method == "group_limited_greedy":
                _check_groups(n_routed_experts, n_group, topk_group, num_experts_per_tok)
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
        self.first_k_dense_replace = first_k_dense_replace
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.n_group = n_group
        self.n_routed_experts = n_routed_experts
        self.output_router_logits = output_router_logits
        self.n_shared_experts = n_shared_experts
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.routed_scaling_factor = routed_scaling_factor
        self.topk_group = topk_group
        self.topk_method = topk_method
        self.norm_topk_prob = norm_topk_prob
        self.v_head_dim = v_head_dim
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension


class DeepseekV2MLP(DeepseekV3MLP):
    """A SwiGLU MLP of `intermediate_size` (default: the config's; the shared experts' is `n_shared_experts *
    moe_intermediate_size`), its projections biased when `mlp_bias`."""

    def __init__(self, config: DeepseekV3Config, intermediate_size: int | None = None) -> None:
        super().__init__()
        intermediate_size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)


class DeepseekV2TopkRouter(DeepseekV3TopkRouter):
    """Router logits `[tokens, experts]` in float32; each token's experts by softmax probability (`topk_method`),
    weighted by their probabilities times `routed_scaling_factor` (`grouped_top_k`)."""

    def __init__(self, config: DeepseekV3Config) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        config = self.config
        router_logits = F.linear(hidden_states.float(), self.weight.float())  # [tokens, experts]
        grouped = config.topk_method == "group_limited_greedy"
        top_k_weights, top_k_index = grouped_top_k(
            router_logits.softmax(dim=-1),
            config.num_experts_per_tok,
            n_group=config.n_group if grouped else 1,
            topk_group=config.topk_group if grouped else 1,
            group_score="max",
            scaling=config.routed_scaling_factor,
        )
        return router_logits, top_k_weights, top_k_index


class DeepseekV2PreTrainedModel(DeepseekV3PreTrainedModel):
    @property
    def _keys_to_ignore_on_load_unexpected(self) -> list[str]:
        """None: V2 checkpoints hold no multi-token-prediction layers."""
        return []

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal, as upstream."""
        super()._init_module(module)
        if isinstance(module, (DeepseekV3Experts, DeepseekV3TopkRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    pass
