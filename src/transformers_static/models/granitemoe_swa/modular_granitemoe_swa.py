"""GraniteMoeSWA: GraniteMoeShared (Granite's four multipliers; top-k of the router logits, a softmax over the
chosen; a shared MLP beside the experts when `shared_intermediate_size` is not 0, upstream's default being 0) with
GraniteSWA's attention: sliding-window layers beside full ones (`config.layer_types`, one mask per kind made once per
forward), a learned sink logit per head in every attention layer (`sinks`: one more column in each query's softmax,
dropped after it; upstream writes it as the output scaled by `sigmoid(logsumexp(scores) - sink)`, the same thing),
and a rotary base per layer (`config.layer_rope_theta`; 0: that layer has no position encoding).

The sinks need the eager kernel (sdpa has no column to add): sdpa is refused, as upstream refuses it. A single 4D
`attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind its own 4D
mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION, mask_converters
from ...modeling_inputs import embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ...moe_utils import MoeModelOutputWithPast
from ..granitemoeshared.configuration_granitemoeshared import GraniteMoeSharedConfig
from ..granitemoeshared.modeling_granitemoeshared import (
    GraniteMoeSharedAttention,
    GraniteMoeSharedDecoderLayer,
    GraniteMoeSharedExperts,
    GraniteMoeSharedForCausalLM,
    GraniteMoeSharedModel,
    GraniteMoeSharedMoE,
    GraniteMoeSharedPreTrainedModel,
    GraniteMoeSharedRMSNorm,
    GraniteMoeSharedRotaryEmbedding,
    GraniteMoeSharedTopKRouter,
    apply_rotary_pos_emb,
)


class GraniteMoeSWAConfig(GraniteMoeSharedConfig):
    """GraniteMoeShared's fields plus GraniteSWA's: `sliding_window` (128), `layer_types` (one of
    "full_attention" / "sliding_attention" per layer; by default every fourth layer is full, starting with the first)
    and `layer_rope_theta` (each layer's rotary base; 0: no position encoding in that layer; by default
    `rope_parameters["rope_theta"]` everywhere). Every attention layer has learned sinks, which need the eager
    kernel: it is the default and sdpa is refused, as upstream."""

    def __init__(
        self,
        vocab_size: int = 32000,
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
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        residual_multiplier: float = 1.0,
        attention_multiplier: float = 1.0,
        num_local_experts: int = 8,
        num_experts_per_tok: int = 2,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        shared_intermediate_size: int = 0,
        sliding_window: int | None = 128,
        layer_types: list[str] | None = None,
        layer_rope_theta: list[float] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        kwargs.setdefault("attn_implementation", "eager")
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
        if not 0 < num_experts_per_tok <= num_local_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
                f"({num_local_experts}): each token is routed to that many experts"
            )
        if shared_intermediate_size < 0:
            raise ValueError(
                f"shared_intermediate_size must be 0 (no shared MLP) or a positive width, got {shared_intermediate_size}"
            )
        if layer_types is None:  # every fourth layer is full, from the first on; the others slide
            layer_types = [FULL_ATTENTION if i % 4 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is None")
        if layer_rope_theta is None:
            layer_rope_theta = [rope_parameters["rope_theta"]] * num_hidden_layers
        if len(layer_rope_theta) != num_hidden_layers or any(theta < 0 for theta in layer_rope_theta):
            raise ValueError(
                f"layer_rope_theta must give each of the {num_hidden_layers} layers a rotary base (0: no position "
                f"encoding), got {layer_rope_theta}"
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
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.residual_multiplier = residual_multiplier
        self.attention_multiplier = attention_multiplier
        self.num_local_experts = num_local_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.shared_intermediate_size = shared_intermediate_size
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)
        self.layer_rope_theta = list(layer_rope_theta)

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them. Each rank holds its query heads' sinks; every expert's intermediate features are split (the routing is
        replicated), the experts' sums all-reduced; the shared MLP's gate and up halves each split evenly, its output
        projection by rows."""
        plan = {
            "layers.*.self_attn": "sinks",
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.block_sparse_moe.experts": "experts",
        }
        if self.shared_intermediate_size:  # a plan entry must name modules that exist
            plan["layers.*.shared_mlp.input_linear"] = "colwise_gate_up"
            plan["layers.*.shared_mlp.output_linear"] = "rowwise"
        return plan


class GraniteMoeSWARotaryEmbedding(GraniteMoeSharedRotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions at one rotary base `rope_theta` (the
    config's other rotary parameters kept), computed in float32 (scaled by YaRN's attention factor with rope_type
    "yarn")."""

    # Copied from transformers_static.models.granite_swa.modeling_granite_swa.GraniteSWARotaryEmbedding.__init__ with GraniteSWA->GraniteMoeSWA
    def __init__(self, config: GraniteMoeSWAConfig, rope_theta: float) -> None:
        super().__init__()
        params, dim = {**config.rope_parameters, "rope_theta": rope_theta}, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]


class GraniteMoeSWAAttention(GraniteMoeSharedAttention):
    """Granite's attention (scores times `attention_multiplier`) with a learned sink logit per head (`sinks`
    `[heads]`) joining each query's softmax; rotary positions only when the layer's base is not 0 (the model then
    passes no tables)."""

    # Copied from transformers_static.models.granite_swa.modeling_granite_swa.GraniteSWAAttention.__init__ with GraniteSWA->GraniteMoeSWA
    def __init__(self, config: GraniteMoeSWAConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = config.attention_multiplier
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.sinks = nn.Parameter(torch.zeros(config.num_attention_heads))  # [heads]

    # Copied from transformers_static.models.granite_swa.modeling_granite_swa.GraniteSWAAttention.forward
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        if position_embeddings is not None:  # None: a layer without position encoding (`layer_rope_theta` 0)
            cos, sin = position_embeddings
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
        attn_output = attention_forward(
            self,
            query,
            key,
            value,
            attention_mask,
            cache_position=cache_position,
            past_key_values=past_key_values,
            scaling=self.scaling,
            dropout=self.attention_dropout,
            sinks=self.sinks,
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class GraniteMoeSWAMoE(GraniteMoeSharedMoE):
    """The router and the experts, saved under their own names: upstream converts no GraniteMoeSWA checkpoint names
    (its checkpoints hold `experts.gate_up_proj`, `experts.down_proj` and `router.weight`, as it saves them)."""

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__()
        self.router = GraniteMoeSharedTopKRouter(config)
        self.experts = GraniteMoeSharedExperts(config)


class GraniteMoeSWADecoderLayer(GraniteMoeSharedDecoderLayer):
    pass


class GraniteMoeSWAPreTrainedModel(GraniteMoeSharedPreTrainedModel):
    # Copied from transformers_static.models.granite_swa.modeling_granite_swa.GraniteSWAPreTrainedModel.__init__ with GraniteSWA->GraniteMoeSWA
    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__(config)
        if config._attn_implementation == "sdpa":
            raise ValueError(
                "GraniteMoeSWA adds a learned sink logit per head to the attention softmax, which sdpa cannot do: use "
                "attn_implementation='eager', this model's default (upstream refuses sdpa for GraniteMoeSWA too)"
            )


class GraniteMoeSWAModel(GraniteMoeSharedModel):
    """GraniteMoeShared's model with one rotary embedding per distinct nonzero base of `layer_rope_theta`
    (`rotary_embs`, in increasing order, as upstream), each layer given its base's tables (none for base 0)."""

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(GraniteMoeSWADecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GraniteMoeSharedRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        thetas = sorted({theta for theta in config.layer_rope_theta if theta})
        self.rotary_embs = nn.ModuleList(GraniteMoeSWARotaryEmbedding(config, theta) for theta in thetas)
        # each layer's index in rotary_embs, None without position encoding
        self.layer_rotary = [thetas.index(theta) if theta else None for theta in config.layer_rope_theta]
        self.mask_converters = mask_converters(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
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
        inputs_embeds = inputs_embeds * self.config.embedding_multiplier  # given embeddings too, as upstream
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
        tables = [rotary_emb(hidden_states, inputs.position_ids) for rotary_emb in self.rotary_embs]
        router_logits = []
        for layer, rotary in zip(self.layers, self.layer_rotary, strict=True):
            hidden_states, layer_router_logits = layer(
                hidden_states, None if rotary is None else tables[rotary], inputs
            )
            router_logits.append(layer_router_logits)
        hidden_states = self.norm(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


class GraniteMoeSWAForCausalLM(GraniteMoeSharedForCausalLM):
    pass
