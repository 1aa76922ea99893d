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
from .configuration_hunyuan_v1_moe import HunYuanMoEV1Config


class HunYuanMoEV1RMSNorm(nn.Module):
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


class HunYuanMoEV1RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (scaled by YaRN's
    attention factor with rope_type "yarn"). rope_type "dynamic" here is NTK-alpha (the config refuses it without
    `alpha`): the default frequencies of the base `rope_theta * alpha ** (head_dim / (head_dim - 2))`."""

    def __init__(self, config: HunYuanMoEV1Config) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        if params["rope_type"] == "dynamic":
            params = {
                "rope_type": "default",
                "rope_theta": params["rope_theta"] * params["alpha"] ** (dim / (dim - 2)),
            }
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


class HunYuanMoEV1MLP(nn.Module):
    """Llama's SwiGLU MLP, always without biases."""

    def __init__(self, config: HunYuanMoEV1Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class HunYuanMoEV1Attention(nn.Module):
    """Llama's attention with RMSNorms over each query and key head (`[head_dim]`, one weight shared by the heads),
    applied after the rotation."""

    def __init__(self, config: HunYuanMoEV1Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.query_layernorm = HunYuanMoEV1RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.key_layernorm = HunYuanMoEV1RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        query, key = self.query_layernorm(query), self.key_layernorm(key)
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
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class HunYuanMoEV1Moe(nn.Module):
    def __init__(self, config: HunYuanMoEV1Config, layer_idx: int) -> None:
        super().__init__()
        self.gate = HunYuanMoEV1Gate(config, layer_idx)
        self.experts = HunYuanMoEV1Experts(config)
        self.shared_mlp = HunYuanMoEV1MLP(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the shared MLP's output plus the experts' weighted sum `[batch, q_len,
        hidden]`, and the router logits `[batch * q_len, experts]`."""
        shared = self.shared_mlp(hidden_states)
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape) + shared, router_logits


class HunYuanMoEV1DecoderLayer(nn.Module):
    """Attention, then the sparse MLP (every layer), returning the layer's router logits too."""

    def __init__(self, config: HunYuanMoEV1Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = HunYuanMoEV1Attention(config, layer_idx)
        self.mlp = HunYuanMoEV1Moe(config, layer_idx)
        self.input_layernorm = HunYuanMoEV1RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = HunYuanMoEV1RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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


class HunYuanMoEV1RouterWeight(nn.Module):
    """The router's projection `[experts, hidden]`, float32 (upstream's `nn.Linear(..., dtype=torch.float32)`).
    Not a linear layer: int8 keeps it exact, as every router."""

    def __init__(self, config: HunYuanMoEV1Config) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, dtype=torch.float32))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.weight)


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


class HunYuanMoEV1PreTrainedModel(PreTrainedModel):
    config_class = HunYuanMoEV1Config
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (HunYuanMoEV1Experts, HunYuanMoEV1RouterWeight)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class HunYuanMoEV1Model(HunYuanMoEV1PreTrainedModel):
    def __init__(self, config: HunYuanMoEV1Config) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(HunYuanMoEV1DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = HunYuanMoEV1RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = HunYuanMoEV1RotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()

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
