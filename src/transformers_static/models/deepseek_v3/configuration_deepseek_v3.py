"""DeepSeek-V3 configuration (also Kimi K2's), with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class DeepseekV3Config(PretrainedConfig):
    """Multi-head latent attention (MLA) and DeepSeek's mixture of experts.

    Attention: queries directly (`q_proj`, `q_lora_rank` None) or through a rank-`q_lora_rank` bottleneck
    (`q_a_proj`, `q_a_layernorm`, `q_b_proj`), `qk_nope_head_dim + qk_rope_head_dim` per head; keys and values from
    one latent of `kv_lora_rank` per token and a rope key of `qk_rope_head_dim` shared by the heads, which is all the
    cache holds (`kv_cache_shape`). `rope_interleave`: the rope dimensions come in interleaved pairs.

    MLP: the first `first_k_dense_replace` layers dense (`intermediate_size`), the others `n_routed_experts` experts
    of `moe_intermediate_size` (`num_local_experts`, upstream's attribute name), `num_experts_per_tok` per token by
    sigmoid score plus `e_score_correction_bias`, within the best `topk_group` of `n_group` groups, weights
    renormalised when `norm_topk_prob` and times `routed_scaling_factor`; plus a shared MLP of `n_shared_experts *
    moe_intermediate_size`. Checkpoints may hold `num_mtp_layers` multi-token-prediction layers after the last one
    (`model.layers.{num_hidden_layers}...`): ignored on load, as upstream.

    `num_key_value_heads` names no heads here (MLA's heads all read the one cached latent): upstream's sdpa ignores
    it too from `num_attention_heads` up (its default, 128, with fewer heads gives the same logits), and fewer is
    refused (upstream's kernels fail on the shapes)."""

    model_type = "deepseek_v3"
    attribute_map = {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 129280,
        hidden_size: int = 7168,
        intermediate_size: int = 18432,
        moe_intermediate_size: int = 2048,
        num_hidden_layers: int = 61,
        num_attention_heads: int = 128,
        num_key_value_heads: int | None = 128,
        n_shared_experts: int = 1,
        n_routed_experts: int = 256,
        output_router_logits: bool = False,
        routed_scaling_factor: float = 2.5,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = 1536,
        qk_rope_head_dim: int = 64,
        v_head_dim: int | None = 128,
        qk_nope_head_dim: int = 128,
        n_group: int | None = 8,
        topk_group: int | None = 4,
        num_experts_per_tok: int | None = 8,
        first_k_dense_replace: int | None = 3,
        norm_topk_prob: bool | None = True,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 1,
        pretraining_tp: int | None = 1,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        rope_interleave: bool | None = True,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        num_mtp_layers: int = 1,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        n_routed_experts = kwargs.pop("num_local_experts", n_routed_experts)
        num_mtp_layers = kwargs.pop("num_nextn_predict_layers", num_mtp_layers)
        kwargs.pop("head_dim", None)  # derived below, as upstream (a saved config.json holds it)
        kwargs.pop("qk_head_dim", None)
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
        if n_routed_experts and not 0 < num_experts_per_tok <= n_routed_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and n_routed_experts "
                f"({n_routed_experts}): each token is routed to that many experts"
            )
        if n_routed_experts and first_k_dense_replace < num_hidden_layers:
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
        self.first_k_dense_replace = first_k_dense_replace
        self.norm_topk_prob = norm_topk_prob
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.rope_interleave = rope_interleave
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.num_mtp_layers = num_mtp_layers
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension

    def kv_cache_shape(self, layer_idx: int) -> tuple[int, int, int]:
        """One key "head" per token: the normed latent then the rope key (`kv_lora_rank + qk_rope_head_dim`), and no
        value slots (the value is the latent, the key's first `kv_lora_rank` dims)."""
        return 1, self.kv_lora_rank + self.qk_rope_head_dim, 0

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else a dense MLP), as upstream decides."""
        return layer_idx >= self.first_k_dense_replace


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
