# Generated from modular_axk1.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""A.X-K1 (skt/A.X-K1, model type `axk1`): DeepSeek-V3's multi-head latent attention, served from a cache of latents
with `kv_b_proj` absorbed (see deepseek_v3), and DeepSeek-V3's mixture of experts, the layers chosen by
`mlp_layer_types` as GLM-4.7-Flash's (see glm4_moe_lite), plus SK Telecom's one change: the MoE block's output goes
through `post_mlp_layernorm` (an RMSNorm, saved at the decoder layer's level as upstream's checkpoints hold it)
before it joins the residual stream. Dense layers have no such norm. A checkpoint without the routers'
`e_score_correction_bias` loads with it zero, as upstream's.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class AXK1Config(PretrainedConfig):
    """DeepSeek-V3's fields with A.X-K1's defaults, `mlp_layer_types` ("dense" or "sparse" per layer) in place of
    `first_k_dense_replace`: when it is not given, layer `i` is sparse when `i >= first_k_dense_replace` (default 1)
    and `i % moe_layer_freq == 0` (default 1), as upstream derives it from those (legacy, unsaved) fields.

    Refused: `q_lora_rank` None (upstream's attention always has the query bottleneck and fails to build without
    it), `mlp_layer_types` entries other than "dense"/"sparse" or of another length than `num_hidden_layers`, fewer
    `num_key_value_heads` than heads (MLA has no key/value heads to group; upstream's kernels fail on the shapes),
    and a `partial_rotary_factor` other than 1 (upstream's rotary tables would not fit the rope dims)."""

    model_type = "axk1"
    attribute_map = {"num_local_experts": "n_routed_experts"}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 163840,
        hidden_size: int = 7168,
        intermediate_size: int = 18432,
        moe_intermediate_size: int = 2048,
        num_hidden_layers: int = 61,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = 64,
        n_shared_experts: int = 1,
        n_routed_experts: int = 192,
        output_router_logits: bool = False,
        routed_scaling_factor: float = 2.5,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = 1536,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        qk_nope_head_dim: int = 128,
        n_group: int = 8,
        topk_group: int = 4,
        num_experts_per_tok: int = 8,
        norm_topk_prob: bool = True,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 163691,
        eos_token_id: int | list[int] | None = 163691,
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
        for derived in ("head_dim", "qk_head_dim"):
            kwargs.pop(derived, None)  # derived below, as upstream (a saved config.json holds them)
        if mlp_layer_types is None:
            first_k_dense_replace = kwargs.pop("first_k_dense_replace", 1)
            moe_layer_freq = kwargs.pop("moe_layer_freq", 1)
            mlp_layer_types = [
                "sparse" if i >= first_k_dense_replace and i % moe_layer_freq == 0 else "dense"
                for i in range(num_hidden_layers)
            ]
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if q_lora_rank is None:
            raise ValueError(
                "q_lora_rank=None: A.X-K1's attention always projects queries through the q_lora_rank bottleneck "
                "(q_a_proj, q_a_layernorm, q_b_proj); upstream's fails to build without it"
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
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension

    def kv_cache_shape(self, layer_idx: int) -> tuple[int, int, int]:
        """One key "head" per token: the normed latent then the rope key (`kv_lora_rank + qk_rope_head_dim`), and no
        value slots (the value is the latent, the key's first `kv_lora_rank` dims)."""
        return 1, self.kv_lora_rank + self.qk_rope_head_dim, 0

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else a dense MLP): `mlp_layer_types`, as upstream."""
        return self.mlp_layer_types[layer_idx] == "sparse"


def _check_groups(n_routed_experts: int, n_group: int | None, topk_group: int | None, top_k: int) -> None:
    """The experts split into `n_group` equal groups, `topk_group` of them kept, holding at least `top_k` experts
    (upstream's router fails on the shapes otherwise, or picks experts of masked groups)."""
    if not n_group or not topk_group or n_routed_experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(
            f"n_routed_experts={n_routed_experts} cannot be split into n_group={n_group} groups of which "
            f"topk_group={topk_group} are kept: n_group must divide the experts and topk_group be between 1 and n_group"
        )
    if top_k > topk_group * (n_routed_experts // n_group):
        raise ValueError(
            f"num_experts_per_tok ({top_k}) exceeds the {topk_group * (n_routed_experts // n_group)} experts that "
            f"topk_group={topk_group} of n_group={n_group} groups hold"
        )
