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

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import standardize_rope_parameters
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts
from ..hunyuan_v1_dense.configuration_hunyuan_v1_dense import HunYuanDenseV1Config
from ..hunyuan_v1_dense.modeling_hunyuan_v1_dense import (
    HunYuanDenseV1Attention,
    HunYuanDenseV1DecoderLayer,
    HunYuanDenseV1MLP,
    HunYuanDenseV1Model,
    HunYuanDenseV1PreTrainedModel,
    HunYuanDenseV1RMSNorm,
)


class HunYuanMoEV1Config(HunYuanDenseV1Config):
    """HunYuan dense V1's fields plus upstream's `num_experts`, `moe_topk` (aliased `num_experts_per_tok`; one int or
    one per layer), `sep_token_id` and `output_router_logits`, with upstream's defaults.

    Hub config.json fields upstream ignores (its model always has one shared MLP of `intermediate_size`, experts of
    `intermediate_size`, query/key norms and no cross-layer attention) are kept as given, and refused with a
    ValueError naming the field when they describe another model: `num_shared_expert` other than 1,
    `use_mixed_mlp_moe` false, `moe_intermediate_size` other than `intermediate_size`, `use_qk_norm` false,
    `use_cla` true. `num_experts` as a list per layer is refused, as upstream's config refuses it."""

    attribute_map = {"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"}

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


class HunYuanMoEV1RouterWeight(nn.Module):
    """The router's projection `[experts, hidden]`, float32 (upstream's `nn.Linear(..., dtype=torch.float32)`).
    Not a linear layer: int8 keeps it exact, as every router."""

    def __init__(self, config: HunYuanMoEV1Config) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, dtype=torch.float32))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.weight)


class HunYuanMoEV1Gate(nn.Module):
    """Router logits `[tokens, experts]` (float32 while the weight is); each token's `moe_topk` experts (this
    layer's) by softmax probability, renormalised over the chosen ones, in the logits' dtype."""

    def __init__(self, config: HunYuanMoEV1Config, layer_idx: int) -> None:
        super().__init__()
        self.top_k = config.layer_top_k(layer_idx)
        self.wg = HunYuanMoEV1RouterWeight(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.wg.weight.dtype == torch.float32:
            hidden_states = hidden_states.float()
        router_logits = self.wg(hidden_states.to(self.wg.weight.dtype))  # [tokens, experts]
        probabilities = F.softmax(router_logits, dim=-1, dtype=torch.float32)
        top_k_weights, top_k_index = torch.topk(probabilities, self.top_k, dim=-1)
        top_k_weights = top_k_weights / top_k_weights.sum(dim=-1, keepdim=True)
        return router_logits, top_k_weights.to(router_logits.dtype), top_k_index


class HunYuanMoEV1Experts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `intermediate_size` (upstream's Mixtral experts), stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: HunYuanMoEV1Config) -> None:
        super().__init__(config.num_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class HunYuanMoEV1Moe(nn.Module):
    def __init__(self, config: HunYuanMoEV1Config, layer_idx: int) -> None:
        super().__init__()
        self.gate = HunYuanMoEV1Gate(config, layer_idx)
        self.experts = HunYuanMoEV1Experts(config)
        self.shared_mlp = HunYuanDenseV1MLP(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the shared MLP's output plus the experts' weighted sum `[batch, q_len,
        hidden]`, and the router logits `[batch * q_len, experts]`."""
        shared = self.shared_mlp(hidden_states)
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape) + shared, router_logits


class HunYuanMoEV1DecoderLayer(HunYuanDenseV1DecoderLayer):
    """Attention, then the sparse MLP (every layer), returning the layer's router logits too."""

    def __init__(self, config: HunYuanMoEV1Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = HunYuanDenseV1Attention(config, layer_idx)
        self.mlp = HunYuanMoEV1Moe(config, layer_idx)
        self.input_layernorm = HunYuanDenseV1RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = HunYuanDenseV1RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        mlp_output, router_logits = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + mlp_output, router_logits


class HunYuanMoEV1PreTrainedModel(HunYuanDenseV1PreTrainedModel):
    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (HunYuanMoEV1Experts, HunYuanMoEV1RouterWeight)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class HunYuanMoEV1Model(HunYuanDenseV1Model):
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_router_logits: bool | None = None,
    ) -> MoeModelOutputWithPast:
        """Also `router_logits` (one `[batch * q_len, experts]` per layer) with `output_router_logits` (default:
        the config's)."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)
        router_logits = []
        for layer in self.layers:
            hidden_states, layer_router_logits = layer(hidden_states, position_embeddings, inputs)
            router_logits.append(layer_router_logits)
        hidden_states = self.norm(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


class HunYuanMoEV1ForCausalLM(MoeCausalLMMixin, HunYuanMoEV1PreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered
    router_aux_loss = False  # upstream computes none for this model

    def __init__(self, config: HunYuanMoEV1Config) -> None:
        super().__init__(config)
        self.model = HunYuanMoEV1Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
