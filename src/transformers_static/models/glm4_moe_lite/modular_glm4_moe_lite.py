"""GLM-4.7-Flash (zai-org, model type `glm4_moe_lite`): DeepSeek-V3's multi-head latent attention, served from a
cache of latents with `kv_b_proj` absorbed (see deepseek_v3), and GLM-4.5's mixture of experts (DeepSeek-V3's
router: sigmoid scores, `e_score_correction_bias`, `n_group` / `topk_group` groups, renormalised when
`norm_topk_prob`, times `routed_scaling_factor`; a shared MLP of `n_shared_experts * moe_intermediate_size`).

What differs from DeepSeek-V3: which layers route is `mlp_layer_types` ("dense" or "sparse" per layer, default a
dense first layer then sparse ones), not `first_k_dense_replace`; checkpoints' multi-token-prediction layer is
`model.layers.47` whatever the depth (upstream's fixed rule), ignored on load.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import standardize_rope_parameters
from ..deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config, _check_groups
from ..deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer,
    DeepseekV3ForCausalLM,
    DeepseekV3PreTrainedModel,
)


class Glm4MoeLiteConfig(DeepseekV3Config):
    """Multi-head latent attention (as DeepSeek-V3's) and GLM-4.5's mixture of experts: layer `i` routes when
    `mlp_layer_types[i] == "sparse"` (`n_routed_experts` experts of `moe_intermediate_size`, `num_local_experts`
    upstream's alias, `num_experts_per_tok` per token by sigmoid score plus `e_score_correction_bias` within the best
    `topk_group` of `n_group` groups, renormalised when `norm_topk_prob`, times `routed_scaling_factor`, plus a shared
    MLP of `n_shared_experts * moe_intermediate_size`), else it is a dense MLP of `intermediate_size`. `head_dim` is
    upstream's alias of `qk_rope_head_dim`.

    Refused: `mlp_layer_types` entries other than "dense"/"sparse" or of another length than `num_hidden_layers`
    (upstream's validation), fewer `num_key_value_heads` than heads (MLA has no key/value heads to group; upstream's
    kernels fail on the shapes), a `partial_rotary_factor` other than 1 (upstream's rotary tables then no longer fit
    the rope dims), and a `head_dim` other than `qk_rope_head_dim`."""

    model_type = "glm4_moe_lite"
    attribute_map = {"num_local_experts": "n_routed_experts", "head_dim": "qk_rope_head_dim"}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 154880,
        hidden_size: int = 2048,
        intermediate_size: int = 10240,
        moe_intermediate_size: int = 1536,
        num_hidden_layers: int = 47,
        num_attention_heads: int = 20,
        num_key_value_heads: int | None = 20,
        n_shared_experts: int = 1,
        n_routed_experts: int = 64,
        output_router_logits: bool = False,
        routed_scaling_factor: float = 1.8,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = 768,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 256,
        qk_nope_head_dim: int = 192,
        n_group: int = 1,
        topk_group: int = 1,
        num_experts_per_tok: int = 4,
        norm_topk_prob: bool = True,
        hidden_act: str = "silu",
        max_position_embeddings: int = 202752,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 1,
        pretraining_tp: int = 1,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        rope_interleave: bool = True,
        mlp_layer_types: list[str] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        n_routed_experts = kwargs.pop("num_local_experts", n_routed_experts)
        head_dim = kwargs.pop("head_dim", None)
        if head_dim is not None and head_dim != qk_rope_head_dim:
            raise ValueError(
                f"head_dim={head_dim} with qk_rope_head_dim={qk_rope_head_dim}: head_dim is upstream's alias of the "
                "rope dims here, so the two must agree"
            )
        kwargs.pop("qk_head_dim", None)  # derived below, as upstream (a saved config.json holds it)
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
        if mlp_layer_types is None:
            mlp_layer_types = ["dense"] + ["sparse"] * (num_hidden_layers - 1)
        mlp_layer_types = list(mlp_layer_types)
        if not set(mlp_layer_types) <= {"dense", "sparse"} or len(mlp_layer_types) != num_hidden_layers:
            raise ValueError(
                f"mlp_layer_types={mlp_layer_types} must hold one of 'dense' / 'sparse' per layer "
                f"(num_hidden_layers={num_hidden_layers})"
            )
        if n_routed_experts and "sparse" in mlp_layer_types:
            if not 0 < num_experts_per_tok <= n_routed_experts:
                raise ValueError(
                    f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and n_routed_experts "
                    f"({n_routed_experts}): each token is routed to that many experts"
                )
            _check_groups(n_routed_experts, n_group, topk_group, num_experts_per_tok)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.n_shared_experts = n_shared_experts
        self.n_routed_experts = n_routed_experts
        self.output_router_logits = output_router_logits
        self.routed_scaling_factor = routed_scaling_factor
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.n_group = n_group
        self.topk_group = topk_group
        self.num_experts_per_tok = num_experts_per_tok
        self.norm_topk_prob = norm_topk_prob
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.rope_interleave = rope_interleave
        self.mlp_layer_types = mlp_layer_types
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else a dense MLP): `mlp_layer_types`, as upstream."""
        return self.mlp_layer_types[layer_idx] == "sparse"


class Glm4MoeLiteDecoderLayer(DeepseekV3DecoderLayer):
    """Latent attention, then the MoE block (returning the layer's router logits too) or, in the layers
    `mlp_layer_types` names "dense", a dense MLP (no router logits)."""


class Glm4MoeLitePreTrainedModel(DeepseekV3PreTrainedModel):
    # upstream's fixed rule: GLM-4.7-Flash's multi-token-prediction layer (layer 47 of its 47), whatever the depth
    _keys_to_ignore_on_load_unexpected = [r"model\.layers\.47.*"]


class Glm4MoeLiteForCausalLM(DeepseekV3ForCausalLM):
    """Router logits with `output_router_logits`, but no auxiliary loss (upstream returns none)."""
