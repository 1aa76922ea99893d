"""Qwen3-Next (Qwen3-Next-80B-A3B): Qwen3.5-MoE's hybrid of gated delta-net layers and gated full attention
(zero-centred RMSNorms, partial rotary positions, a sigmoid-gated shared expert beside the routed experts), with
Qwen3-MoE's layer placement: a layer routes to experts when it is not in `mlp_only_layers` and `(layer + 1) %
decoder_sparse_step == 0` (and there are experts), else it is a dense SwiGLU MLP of `intermediate_size`; the router
renormalises the chosen experts' weights only with `norm_topk_prob`.

The delta-net's projections are fused as upstream's checkpoints hold them: `in_proj_qkvz` gives, per query/key
head, its query, its key, then the values and output gates of the value heads it serves; `in_proj_ba` gives per
query/key head the write strengths then the decays of those value heads. They are reordered into Qwen3.5's
queries/keys/values before the convolution.

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
from ...modeling_attn_mask_utils import LINEAR_ATTENTION, attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, softmax_top_k
from ...recurrent_utils import delta_rule_gates, fed_slots, gated_delta_rule, visible_conv
from .configuration_qwen3_next import Qwen3NextConfig


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeRMSNorm with Qwen3_5Moe->Qwen3Next
class Qwen3NextRMSNorm(nn.Module):
    """RMSNorm around 1: `x / rms(x) * (1 + weight)`, in float32 (weights start at zero)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * (1.0 + self.weight.float())).type_as(hidden_states)


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeRMSNormGated with Qwen3_5Moe->Qwen3Next
class Qwen3NextRMSNormGated(nn.Module):
    """`weight * x / rms(x) * silu(gate)` per head (the norm in float32, the weight applied in the input's dtype)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        x = self.weight * x.to(input_dtype)
        return (x * F.silu(gate.float())).to(input_dtype)


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeTextRotaryEmbedding with Qwen3_5MoeTextRotaryEmbedding->Qwen3NextRotaryEmbedding,Qwen3_5Moe->Qwen3Next,Qwen3NextTextConfig->Qwen3NextConfig
class Qwen3NextRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_dim]` for the given positions, computed in float32: only the first
    `rotary_dim` dims of each head rotate."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, config.rotary_dim, config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, rotary_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, rotary_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.apply_rotary_pos_emb
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.apply_partial_rotary_pos_emb
def apply_partial_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first `rotary_ndims` dims of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, rotary_ndims]`; the other dims pass through unchanged."""
    rotary_ndims = cos.shape[-1]
    q_rot, k_rot = apply_rotary_pos_emb(q[..., :rotary_ndims], k[..., :rotary_ndims], cos, sin)
    q = torch.cat((q_rot, q[..., rotary_ndims:]), dim=-1)  # [batch, heads, q_len, head_dim]
    k = torch.cat((k_rot, k[..., rotary_ndims:]), dim=-1)
    return q, k


class Qwen3NextMLP(nn.Module):
    """A SwiGLU MLP of `intermediate_size` (the dense layers' `config.intermediate_size` unless given: the shared
    expert's is `shared_expert_intermediate_size`)."""

    def __init__(self, config: Qwen3NextConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        intermediate_size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeAttention with Qwen3_5Moe->Qwen3Next,Qwen3NextTextConfig->Qwen3NextConfig
class Qwen3NextAttention(nn.Module):
    """Qwen3's attention with a gated output: `q_proj` gives each head its query and a gate side by side, and the
    merged heads are multiplied by `sigmoid(gate)` before `o_proj`."""

    def __init__(self, config: Qwen3NextConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, 2 * q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = Qwen3NextRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3NextRMSNorm(self.head_dim, eps=config.rms_norm_eps)

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
        query, gate = self.q_proj(hidden_states).view(batch, q_len, -1, 2 * self.head_dim).chunk(2, dim=-1)
        query = self.q_norm(query).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [.., kv_heads, ..]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_partial_rotary_pos_emb(query, key, cos, sin)
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
        return self.o_proj(attn_output * torch.sigmoid(gate.reshape(batch, q_len, -1)))


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.l2_normalize
def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dim."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class Qwen3NextGatedDeltaNet(nn.Module):
    """Qwen3.5's gated delta-net with upstream Qwen3-Next's fused projections (see the module docstring)."""

    def __init__(self, config: Qwen3NextConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_kernel_size = config.linear_conv_kernel_dim
        conv_dim = config.linear_conv_dim
        self.conv1d = nn.Conv1d(
            conv_dim, conv_dim, self.conv_kernel_size, groups=conv_dim, padding=self.conv_kernel_size - 1, bias=False
        )
        self.act = get_activation(config.hidden_act)
        self.in_proj_qkvz = nn.Linear(config.hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(config.hidden_size, 2 * self.num_v_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads).uniform_(0.01, 16).log())
        self.norm = Qwen3NextRMSNormGated(self.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, config.hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        states = past_key_values.states(self.layer_idx) if past_key_values is not None else None
        conv_state, slots, state = (
            (None, None, None) if states is None else (states[name][:batch] for name in ("conv", "slots", "recurrent"))
        )
        # [batch, q_len, taps]: which of the tokens fed before each one it sees
        visible, slots, kept = fed_slots(attention_mask, cache_position, slots, self.conv_kernel_size)

        groups = self.num_v_heads // self.num_k_heads  # each query/key head serves `groups` value heads
        qkvz = self.in_proj_qkvz(hidden_states).view(batch, q_len, self.num_k_heads, -1)
        query, key, value, z = qkvz.split([self.head_k_dim, self.head_k_dim, *[groups * self.head_v_dim] * 2], -1)
        beta, a = self.in_proj_ba(hidden_states).view(batch, q_len, self.num_k_heads, -1).split([groups] * 2, -1)
        beta, a = beta.reshape(batch, q_len, -1), a.reshape(batch, q_len, -1)  # [batch, q_len, v_heads]
        mixed = torch.cat([t.reshape(batch, q_len, -1) for t in (query, key, value)], -1).transpose(1, 2)

        conv_out, conv_state = visible_conv(mixed, conv_state, self.conv1d.weight[:, 0], visible, kept)
        query, key, value = self.act(conv_out).transpose(1, 2).split([self.key_dim, self.key_dim, self.value_dim], -1)
        query, key = (
            l2_normalize(t.reshape(batch, q_len, -1, self.head_k_dim).float()).repeat_interleave(groups, dim=2)
            for t in (query, key)
        )  # [batch, q_len, v_heads, k_dim]
        value = value.reshape(batch, q_len, -1, self.head_v_dim)

        log_decay = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        log_decay, beta, starts = delta_rule_gates(visible, log_decay, beta.sigmoid())
        out, state = gated_delta_rule(query * self.head_k_dim**-0.5, key, value, log_decay, beta, starts, state)
        if past_key_values is not None:
            past_key_values.update_states(self.layer_idx, {"conv": conv_state, "slots": slots, "recurrent": state})

        z = z.reshape(batch, q_len, -1, self.head_v_dim)
        out = self.norm(out.to(hidden_states.dtype), z)  # [batch, q_len, v_heads, v_dim]
        return self.out_proj(out.reshape(batch, q_len, -1))


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeSparseMoeBlock with Qwen3_5Moe->Qwen3Next,Qwen3NextTextConfig->Qwen3NextConfig
class Qwen3NextSparseMoeBlock(nn.Module):
    """The routed experts' weighted sum plus the shared expert, gated per token by
    `sigmoid(shared_expert_gate(x))`."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        self.gate = Qwen3NextTopKRouter(config)
        self.experts = Qwen3NextExperts(config)
        self.shared_expert = Qwen3NextMLP(config, intermediate_size=config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum plus the gated shared expert `[batch, q_len,
        hidden]`, and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        shared = F.sigmoid(self.shared_expert_gate(tokens)) * self.shared_expert(tokens)  # [batch * q_len, hidden]
        return (out + shared).reshape(hidden_states.shape), router_logits


class Qwen3NextDecoderLayer(nn.Module):
    """A token mixer (gated delta-net or attention, by `layer_types`), then the sparse MLP (returning the layer's
    router logits too) or, off the sparse layers, a dense one (no router logits)."""

    def __init__(self, config: Qwen3NextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        if config.layer_types[layer_idx] == LINEAR_ATTENTION:
            self.linear_attn = Qwen3NextGatedDeltaNet(config, layer_idx)
        else:
            self.self_attn = Qwen3NextAttention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = Qwen3NextSparseMoeBlock(config) if self.sparse else Qwen3NextMLP(config)
        self.input_layernorm = Qwen3NextRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3NextRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        mask = inputs.masks[self.attention_type]
        if hasattr(self, "linear_attn"):
            hidden_states = self.linear_attn(hidden_states, mask, inputs.cache_position, inputs.past_key_values)
        else:
            hidden_states = self.self_attn(
                hidden_states,
                position_embeddings,
                attention_mask=mask,
                cache_position=inputs.cache_position,
                past_key_values=inputs.past_key_values,
            )
        hidden_states = residual + hidden_states
        normed = self.post_attention_layernorm(hidden_states)
        if not self.sparse:
            return hidden_states + self.mlp(normed), None
        mlp_output, router_logits = self.mlp(normed)
        return hidden_states + mlp_output, router_logits


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeExperts with Qwen3_5Moe->Qwen3Next,Qwen3NextTextConfig->Qwen3NextConfig
class Qwen3NextExperts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `moe_intermediate_size`, stacked (saved one matrix each, as upstream)."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__(config.num_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class Qwen3NextTopKRouter(nn.Module):
    """Router logits `[tokens, experts]`; each token's top-k experts by softmax probability (float32), renormalised
    over the chosen ones when `norm_topk_prob`, then in the logits' dtype."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight)  # [tokens, experts]
        top_k_weights, top_k_index = softmax_top_k(router_logits, self.top_k, normalize=self.norm_topk_prob)
        return router_logits, top_k_weights.to(router_logits.dtype), top_k_index


class Qwen3NextPreTrainedModel(PreTrainedModel):
    config_class = Qwen3NextConfig
    base_model_prefix = "model"
    _keys_to_ignore_on_load_unexpected = [r"^mtp\.", r"^model\.visual\."]  # as upstream: not used for text decoding

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too (the
        delta-net's decay parameters and the zero-centred norms keep their constructors' values)."""
        super()._init_module(module)
        if isinstance(module, (Qwen3NextExperts, Qwen3NextTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class Qwen3NextModel(Qwen3NextPreTrainedModel):
    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Qwen3NextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3NextRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3NextRotaryEmbedding(config)
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
        """Also `router_logits` (one `[batch * q_len, experts]` per sparse layer) with `output_router_logits`
        (default: the config's)."""
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
            if layer_router_logits is not None:
                router_logits.append(layer_router_logits)
        hidden_states = self.norm(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


# Copied from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeForCausalLM with Qwen3_5Moe->Qwen3Next,Qwen3NextTextConfig->Qwen3NextConfig,Qwen3NextTextModel->Qwen3NextModel
class Qwen3NextForCausalLM(MoeCausalLMMixin, Qwen3NextPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__(config)
        self.model = Qwen3NextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
