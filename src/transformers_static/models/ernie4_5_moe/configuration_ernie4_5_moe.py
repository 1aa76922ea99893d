# Generated from modular_ernie4_5_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Ernie 4.5 MoE (Baidu): Ernie 4.5's blocks (interleaved rotary positions in float32, one `use_bias` switch for
every projection, the LM head's bias included) with sparse MLP layers. Layer `i` is sparse when
`(i + 1) % moe_layer_interval == 0` and `moe_layer_start_index <= i <= moe_layer_end_index` (-1: the last layer),
else a dense MLP of `intermediate_size`.

A sparse layer routes each token to `moe_k` of `moe_num_experts` SwiGLU experts of width `moe_intermediate_size`
(no biases): the router's logits and softmax are float32 (its weight and the correction bias stay float32 whatever
the model's dtype, as upstream keeps them), the experts are CHOSEN by softmax + `e_score_correction_bias` but
weighted by the unbiased probabilities, renormalised by their sum clamped to at least `moe_norm_min`.
`moe_num_shared_experts` shared experts (one MLP of `moe_num_shared_experts * moe_intermediate_size`, with
`use_bias`) see every token and add to the routed sum.

The experts are stacked parameters run as one static graph for every routing (moe_utils); checkpoints keep
upstream's saved layout: `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`, `mlp.gate.weight`,
`mlp.moe_statics.e_score_correction_bias` `[1, experts]` (the module's `mlp.gate.moe_statics`) and
`mlp.shared_experts.*`. Multi-token-prediction
weights (`mtp*`) of the Hub checkpoints are ignored, as upstream ignores them.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class Ernie4_5_MoeConfig(PretrainedConfig):
    """Upstream's fields and defaults (ERNIE-4.5-21B-A3B's sizes); `num_experts` and `num_experts_per_tok` alias
    `moe_num_experts` and `moe_k`, as upstream. As upstream, `head_dim` is not a field: a config.json may hold one,
    else it is `hidden_size // num_attention_heads` (saved then, the same value upstream reads);
    `moe_layer_end_index` -1 is stored as the last layer."""

    model_type = "ernie4_5_moe"

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them, for the MLP kinds this config's layers have (a plan entry must name modules that exist). Every
        routed expert's intermediate features are split (the routing is replicated) and the shared experts split
        as a dense MLP; the sums are all-reduced, a bias added once."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        sparse = {self.is_sparse_layer(i) for i in range(self.num_hidden_layers)}
        if True in sparse:
            plan["layers.*.mlp.experts"] = "experts"
            if self.moe_num_shared_experts:
                plan.update(
                    {
                        "layers.*.mlp.shared_experts.gate_proj": "colwise",
                        "layers.*.mlp.shared_experts.up_proj": "colwise",
                        "layers.*.mlp.shared_experts.down_proj": "rowwise",
                    }
                )
        if False in sparse:
            plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise"})
            plan["layers.*.mlp.down_proj"] = "rowwise"
        return plan

    def __init__(
        self,
        vocab_size: int = 103424,
        hidden_size: int = 2560,
        intermediate_size: int = 12288,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 20,
        num_key_value_heads: int | None = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        use_bias: bool = False,
        moe_intermediate_size: int = 1536,
        moe_k: int = 6,
        moe_num_experts: int = 64,
        moe_num_shared_experts: int = 2,
        moe_layer_start_index: int = 1,
        moe_layer_end_index: int = -1,
        moe_layer_interval: int = 1,
        moe_norm_min: float = 1e-12,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=500000.0
        )
        moe_num_experts = kwargs.pop("num_experts", kwargs.pop("num_local_experts", moe_num_experts))
        moe_k = kwargs.pop("num_experts_per_tok", moe_k)
        head_dim = kwargs.pop("head_dim", None)
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
        if not 0 < moe_k <= moe_num_experts:
            raise ValueError(
                f"moe_k ({moe_k}) must be between 1 and moe_num_experts ({moe_num_experts}): each token is routed to"
                " that many experts"
            )
        if moe_layer_interval < 1:
            raise ValueError(f"moe_layer_interval must be a positive layer interval, got {moe_layer_interval}")
        if moe_num_shared_experts < 0:
            raise ValueError(f"moe_num_shared_experts must be 0 or more, got {moe_num_shared_experts}")
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
        self.use_bias = use_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.moe_intermediate_size = moe_intermediate_size
        self.moe_k = moe_k
        self.moe_num_experts = moe_num_experts
        self.moe_num_shared_experts = moe_num_shared_experts
        self.moe_layer_start_index = moe_layer_start_index
        self.moe_layer_end_index = num_hidden_layers - 1 if moe_layer_end_index == -1 else moe_layer_end_index
        self.moe_layer_interval = moe_layer_interval
        self.moe_norm_min = moe_norm_min
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef

    attribute_map = {
        "num_experts": "moe_num_experts",
        "num_local_experts": "moe_num_experts",
        "num_experts_per_tok": "moe_k",
    }

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else it is a dense MLP), as upstream decides."""
        return (
            layer_idx + 1
        ) % self.moe_layer_interval == 0 and self.moe_layer_start_index <= layer_idx <= self.moe_layer_end_index
