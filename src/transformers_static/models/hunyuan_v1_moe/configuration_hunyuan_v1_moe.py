# Generated from modular_hunyuan_v1_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""HunYuan MoE V1 (Tencent, Hunyuan-A13B): HunYuan dense V1's attention (per-head query/key RMSNorms after the
rotation, NTK-alpha rotary) with a mixture-of-experts MLP on every layer: `num_experts` SwiGLU experts of width
`intermediate_size`, `moe_topk` of them per token (one int, or one per layer), chosen by a float32 softmax router
(`gate.wg`, kept float32 whatever the model's dtype, as upstream builds it) and renormalised over the chosen ones,
plus one shared SwiGLU MLP (`shared_mlp`, width `intermediate_size`) that every token runs.

Upstream computes no load-balancing loss for this model (its config has no `router_aux_loss_coef`): router logits
are returned with `output_router_logits`, and the loss is the LM loss.

The Hub checkpoints' config.json files hold fields that upstream's config does not know and its model ignores,
building one fixed architecture; each one that would describe another architecture is refused by name (see
`HunYuanMoEV1Config`), never silently run as upstream's.

The experts are stacked parameters run as one static graph for every routing (moe_utils); checkpoints keep
upstream's saved layout, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class HunYuanMoEV1Config(PretrainedConfig):
    """HunYuan dense V1's fields plus upstream's `num_experts`, `moe_topk` (aliased `num_experts_per_tok`; one int or
    one per layer), `sep_token_id` and `output_router_logits`, with upstream's defaults.

    Hub config.json fields upstream ignores (its model always has one shared MLP of `intermediate_size`, experts of
    `intermediate_size`, query/key norms and no cross-layer attention) are kept as given, and refused with a
    ValueError naming the field when they describe another model: `num_shared_expert` other than 1,
    `use_mixed_mlp_moe` false, `moe_intermediate_size` other than `intermediate_size`, `use_qk_norm` false,
    `use_cla` true. `num_experts` as a list per layer is refused, as upstream's config refuses it."""

    model_type = "hunyuan_v1_moe"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # The query/key norms are per head, so each rank norms its own heads; every expert's intermediate features are
    # split (the routing is replicated) and the shared MLP as a dense one; the sums are all-reduced.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.experts": "experts",
        "layers.*.mlp.shared_mlp.gate_proj": "colwise",
        "layers.*.mlp.shared_mlp.up_proj": "colwise",
        "layers.*.mlp.shared_mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 290943,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        eod_token_id: int | None = 3,
        sep_token_id: int | None = 4,
        pretraining_tp: int = 1,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        num_experts: int = 1,
        output_router_logits: bool = False,
        moe_topk: int | list[int] = 1,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        rope_scaling = kwargs.pop("rope_scaling", None)
        rope_parameters = dict(rope_parameters or rope_scaling or {})
        ntk_alpha = rope_parameters.get("rope_type", rope_parameters.get("type")) == "dynamic" and bool(
            rope_parameters.get("alpha")
        )
        if ntk_alpha:  # standardised as the default type, then labelled "dynamic" again as the checkpoint has it
            rope_parameters.pop("type", None)
            rope_parameters["rope_type"] = "default"
        rope_parameters = standardize_rope_parameters(rope_parameters, kwargs.pop("rope_theta", None), None)
        if ntk_alpha:
            rope_parameters["rope_type"] = "dynamic"
        num_experts = kwargs.pop("num_local_experts", num_experts)
        moe_topk = kwargs.pop("num_experts_per_tok", moe_topk)
        self._check_unsupported_fields(kwargs, intermediate_size)
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
        if not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(
                f"num_experts must be one positive int (every layer's experts; upstream's config takes no list),"
                f" got {num_experts!r}"
            )
        top_ks = moe_topk if isinstance(moe_topk, list) else [moe_topk] * num_hidden_layers
        if len(top_ks) != num_hidden_layers or not all(isinstance(k, int) and 0 < k <= num_experts for k in top_ks):
            raise ValueError(
                f"moe_topk must be an int between 1 and num_experts ({num_experts}), or a list of one such int per"
                f" layer ({num_hidden_layers}), got {moe_topk!r}"
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
        self.eod_token_id = eod_token_id
        self.sep_token_id = sep_token_id
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.num_experts = num_experts
        self.output_router_logits = output_router_logits
        self.moe_topk = moe_topk
        # upstream keeps None here and then fails to build the model; the usual derivation instead
        self.head_dim = head_dim or hidden_size // num_attention_heads

    attribute_map = {"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"}

    def layer_top_k(self, layer_idx: int) -> int:
        """The experts each token of layer `layer_idx` is routed to."""
        return self.moe_topk if isinstance(self.moe_topk, int) else self.moe_topk[layer_idx]

    @staticmethod
    def _check_unsupported_fields(kwargs: dict[str, Any], intermediate_size: int) -> None:
        """The Hub config.json fields upstream ignores, refused when they describe another architecture than the one
        upstream builds (a per-layer list counts when every entry is the supported value)."""

        def values(field: str) -> list[Any]:
            value = kwargs[field]
            return list(value) if isinstance(value, (list, tuple)) else [value]

        supported = {
            "num_shared_expert": (1, "one shared MLP (upstream's `shared_mlp`)"),
            "use_mixed_mlp_moe": (True, "the shared MLP beside the experts, which upstream always runs"),
            "moe_intermediate_size": (intermediate_size, "experts of `intermediate_size`, as upstream builds them"),
            "use_qk_norm": (True, "the query/key norms, which upstream always applies"),
            "use_cla": (False, "no cross-layer attention (upstream has none)"),
        }
        for field, (value, meaning) in supported.items():
            if field in kwargs and kwargs[field] is not None and any(v != value for v in values(field)):
                raise ValueError(
                    f"{field}={kwargs[field]!r} is not supported: upstream's HunYuan-MoE model runs {meaning}, i.e."
                    f" {field}={value!r}"
                )
