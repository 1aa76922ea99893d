# Generated from modular_granitemoe_swa.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
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

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts
from .configuration_granitemoe_swa import GraniteMoeSWAConfig


class GraniteMoeSWARMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GraniteMoeSWARotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions at one rotary base `rope_theta` (the
    config's other rotary parameters kept), computed in float32 (scaled by YaRN's attention factor with rope_type
    "yarn")."""

    # Copied from transformers_static.models.granite_swa.modeling_granite_swa.GraniteSWARotaryEmbedding.__init__ with GraniteSWA->GraniteMoeSWA
    def __init__(self, config: GraniteMoeSWAConfig, rope_theta: float) -> None:
        super().__init__()
        params, dim = {**config.rope_parameters, "rope_theta": rope_theta}, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class GraniteMoeSWAAttention(nn.Module):
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


class GraniteMoeSWAExperts(StackedExperts):
    """`num_local_experts` SwiGLU MLPs of width `intermediate_size`, stacked."""

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class GraniteMoeSWATopKRouter(nn.Module):
    """Router logits `[tokens, experts]` in float32; each token's top-k experts by logit, weighted by a softmax over
    those k logits, then in the hidden states' dtype (upstream's order and dtypes)."""

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight).float()  # [tokens, experts]
        top_k_logits, top_k_index = router_logits.topk(self.top_k, dim=-1)  # [tokens, top_k]
        top_k_weights = F.softmax(top_k_logits, dim=-1).to(hidden_states.dtype)
        return router_logits, top_k_weights, top_k_index


class GraniteMoeSWAMoE(nn.Module):
    """The router and the experts, saved under their own names: upstream converts no GraniteMoeSWA checkpoint names
    (its checkpoints hold `experts.gate_up_proj`, `experts.down_proj` and `router.weight`, as it saves them)."""

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__()
        self.router = GraniteMoeSWATopKRouter(config)
        self.experts = GraniteMoeSWAExperts(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]` (float32)."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.router(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class GraniteMoeSWAMLP(nn.Module):
    """The shared SwiGLU MLP: `input_linear` holds the gate rows then the up rows."""

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__()
        hidden, intermediate = config.hidden_size, config.shared_intermediate_size
        self.input_linear = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.output_linear = nn.Linear(intermediate, hidden, bias=False)
        self.activation = get_activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(hidden_states).chunk(2, dim=-1)
        return self.output_linear(self.activation(gate) * up)


class GraniteMoeSWADecoderLayer(nn.Module):
    """GraniteMoe's block with the shared MLP's output (when there is one) added to the experts' before the
    residual multiplier; returns the hidden states and the layer's router logits."""

    def __init__(self, config: GraniteMoeSWAConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = GraniteMoeSWAAttention(config, layer_idx)
        self.block_sparse_moe = GraniteMoeSWAMoE(config)
        self.shared_mlp = GraniteMoeSWAMLP(config) if config.shared_intermediate_size else None
        self.input_layernorm = GraniteMoeSWARMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GraniteMoeSWARMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.residual_multiplier = config.residual_multiplier

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_output = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + attn_output * self.residual_multiplier
        normed = self.post_attention_layernorm(hidden_states)
        mlp_output, router_logits = self.block_sparse_moe(normed)
        if self.shared_mlp is not None:
            mlp_output = mlp_output + self.shared_mlp(normed)
        return hidden_states + mlp_output * self.residual_multiplier, router_logits


class GraniteMoeSWAPreTrainedModel(PreTrainedModel):
    config_class = GraniteMoeSWAConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (GraniteMoeSWAExperts, GraniteMoeSWATopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)

    # Copied from transformers_static.models.granite_swa.modeling_granite_swa.GraniteSWAPreTrainedModel.__init__ with GraniteSWA->GraniteMoeSWA
    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__(config)
        if config._attn_implementation == "sdpa":
            raise ValueError(
                "GraniteMoeSWA adds a learned sink logit per head to the attention softmax, which sdpa cannot do: use "
                "attn_implementation='eager', this model's default (upstream refuses sdpa for GraniteMoeSWA too)"
            )


class GraniteMoeSWAModel(GraniteMoeSWAPreTrainedModel):
    """GraniteMoeShared's model with one rotary embedding per distinct nonzero base of `layer_rope_theta`
    (`rotary_embs`, in increasing order, as upstream), each layer given its base's tables (none for base 0)."""

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(GraniteMoeSWADecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GraniteMoeSWARMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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


class GraniteMoeSWAForCausalLM(MoeCausalLMMixin, GraniteMoeSWAPreTrainedModel):
    """The head's logits divided by `logits_scaling` (the loss sees them so, as upstream's)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: GraniteMoeSWAConfig) -> None:
        super().__init__(config)
        self.model = GraniteMoeSWAModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.config.logits_scaling  # [batch, q_len, vocab]
