# Generated from modular_phimoe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""PhiMoE (microsoft/Phi-3.5-MoE-instruct): Mixtral's layout with LayerNorms (weight and bias, not RMSNorms),
optional biases on the four attention projections (`attention_bias`) and on the head (`lm_head_bias`), and
Phi-3.5-MoE's sparsemixer router: the best expert, then the best of the rest, each weighted by a softmax over the
experts whose logits lie within a relative `2 * router_jitter_noise` of that expert's (the others masked out).

Rotary positions: the default table, or LongRoPE's short-factor table (upstream never uses the long factors) with
cos/sin scaled by `short_mscale`, or by `long_mscale` once a forward's largest position reaches
`original_max_position_embeddings`, as upstream chooses per forward (a `torch.where` here: no host read).

Refused by name: `num_experts_per_tok` other than 2 (upstream's sparsemixer always routes to two experts), rope
types other than default and longrope, training mode (upstream's training router samples experts with Gumbel
noise and a custom gradient estimator, and jitters its input: nothing a deterministic port reproduces), and a
`generate` whose sequence crosses `original_max_position_embeddings` (upstream drops its cache there and runs the
whole sequence again with the long scale).

Checkpoints keep upstream's saved layout: `block_sparse_moe.experts.{e}.w1/w2/w3.weight`, `block_sparse_moe.gate.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import (
    standardize_longrope_parameters,
    standardize_rope_parameters,
)


class PhimoeConfig(PretrainedConfig):
    """Upstream's fields and defaults (Phi-3.5-MoE's sizes). `num_local_experts` experts, two per token
    (`num_experts_per_tok` must be 2). `router_jitter_noise` is the sparsemixer's relative threshold (used in
    inference too); `input_jitter_noise` scales the router's input by uniform noise while training, which is
    refused. `rms_norm_eps` is the LayerNorms' eps. `head_dim` is not a field (a config.json may hold one).

    `rope_parameters` (or the older `rope_scaling`): the default table or `rope_type="longrope"` ("su" too) with
    `short_factor`, `long_factor` (one per rotated pair), numbers `short_mscale` and `long_mscale`, and
    `original_max_position_embeddings` (default `max_position_embeddings`), also kept as a config attribute as
    upstream keeps it."""

    model_type = "phimoe"
    attribute_map: dict[str, str] = {}
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.experts": "experts",
    }

    def __init__(
        self,
        vocab_size: int = 32064,
        hidden_size: int = 4096,
        intermediate_size: int = 6400,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 8,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096 * 32,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        sliding_window: int | None = None,
        attention_dropout: float = 0.0,
        num_experts_per_tok: int = 2,
        num_local_experts: int = 16,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        router_jitter_noise: float = 0.01,
        input_jitter_noise: float = 0.0,
        attention_bias: bool = False,
        lm_head_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        params = dict(kwargs.pop("rope_scaling", None) or rope_parameters or {})
        if params.get("rope_type", params.get("type")) == "su":
            params["rope_type"] = "longrope"
        longrope = params.get("rope_type", params.get("type")) == "longrope"
        if longrope:
            params["rope_type"] = "longrope"
            params.setdefault("rope_theta", kwargs.pop("rope_theta", 1e6))
            params = standardize_longrope_parameters(params, None, max_position_embeddings)
            for name in ("short_mscale", "long_mscale"):
                if not isinstance(params.get(name), (int, float)):
                    raise TypeError(f"`rope_parameters`'s {name} field must be a number, got {params.get(name)}")
            kwargs["original_max_position_embeddings"] = params["original_max_position_embeddings"]
        else:
            params = standardize_rope_parameters(params, kwargs.pop("rope_theta", None), None, default_theta=1e6)
            if params["rope_type"] != "default":
                raise ValueError(
                    f"rope_type={params['rope_type']!r} is not supported for PhiMoE: upstream scales its cos/sin by "
                    "short_mscale / long_mscale whatever the type; only 'default' and 'longrope' are ported"
                )
        if num_experts_per_tok != 2:
            raise ValueError(
                f"num_experts_per_tok={num_experts_per_tok} is not supported: upstream's sparsemixer always routes "
                "each token to two experts"
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
        _check_experts(num_experts_per_tok, num_local_experts)
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
        self.rope_parameters = params
        self.sliding_window = sliding_window
        self.attention_dropout = attention_dropout
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_local_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.router_jitter_noise = router_jitter_noise
        self.input_jitter_noise = input_jitter_noise
        self.attention_bias = attention_bias
        self.lm_head_bias = lm_head_bias


def _check_experts(num_experts_per_tok: int, num_local_experts: int) -> None:
    """A token picks at least one and at most all of the experts."""
    if not 0 < num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
            f"({num_local_experts}): each token is routed to that many experts"
        )
