# Generated from modular_cohere2_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Cohere2-MoE: Cohere2's layers (attention and MLP in parallel off one norm, sliding-window layers with interleaved
rotary positions beside global layers without positions, logits times `logit_scale`) with sparse MLPs: a router
takes each token's `num_experts_per_tok` largest logits and weighs their experts by a softmax over those logits
(`expert_selection_fn="softmax"`) or by their sigmoids (`"sigmoid"`, renormalised when `norm_topk_prob`);
`num_shared_experts` always-on experts (one SwiGLU MLP of `num_shared_experts * intermediate_size`) are summed
with the routed output or averaged with it (`shared_expert_combination_strategy`). Layers listed "dense" in
`mlp_layer_types` (the first `first_k_dense_replace`, when a config gives that) keep a dense MLP of
`prefix_dense_intermediate_size`; with `prefix_dense_sliding_window_pattern == 1` they are global layers that
rotate anyway. The norms are RMSNorms when `rms_norm_eps` is set, else Cohere's bias-free LayerNorms.

The experts are stacked and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import compute_inv_freq
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts
from .configuration_cohere2_moe import Cohere2MoeConfig


class Cohere2MoeLayerNorm(nn.Module):
    """LayerNorm without a bias: mean-centred, scaled by `weight`, computed in float32 and cast back at the end."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        centred = hidden_states - hidden_states.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        hidden_states = centred * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight.float() * hidden_states).to(input_dtype)


class Cohere2MoeRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32, each frequency
    repeated for the two dims of its interleaved pair."""

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__()
        inv_freq = compute_inv_freq(config.rope_parameters, config.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = freqs.repeat_interleave(2, dim=-1)  # [batch, q_len, head_dim]
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs `(x0, x1), (x2, x3), ...` -> `(-x1, x0), (-x3, x2), ...`."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the interleaved pairs of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, head_dim]`, in float32 (as upstream), returned in the queries' dtype."""
    cos, sin = cos[:, None].float(), sin[:, None].float()  # [batch, 1, q_len, head_dim]
    rotated = [x.float() * cos + rotate_every_two(x.float()) * sin for x in (q, k)]
    return rotated[0].to(q.dtype), rotated[1].to(k.dtype)


class Cohere2MoeMLP(nn.Module):
    """A SwiGLU MLP of `intermediate_size`, or of the given width (dense layers', shared experts')."""

    def __init__(self, config: Cohere2MoeConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        width = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Cohere2MoeAttention(nn.Module):
    def __init__(self, config: Cohere2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        # sliding-window layers rotate queries and keys, and so do the dense prefix layers (global ones) when
        # prefix_dense_sliding_window_pattern is 1; the other global layers have no position encoding
        dense_rotates = (
            config.mlp_layer_types[layer_idx] == "dense" and config.prefix_dense_sliding_window_pattern == 1
        )
        self.use_rope = attention_type(config, layer_idx) == SLIDING_ATTENTION or dense_rotates
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)

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
        if self.use_rope:  # Ignore copy
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
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


def norm(config: Cohere2MoeConfig) -> nn.Module:
    """An RMSNorm of `rms_norm_eps` when the config sets one, else Cohere's LayerNorm of `layer_norm_eps`."""
    if config.rms_norm_eps is not None:
        return Cohere2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return Cohere2MoeLayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class Cohere2MoeSparseMoeBlock(nn.Module):
    """The routed experts' weighted sum, summed with or averaged with the shared experts' output if any."""

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__()
        self.gate = Cohere2MoeTopKRouter(config)
        self.experts = Cohere2MoeExperts(config)
        self.average = config.shared_expert_combination_strategy == "average"
        self.has_shared_experts = config.num_shared_experts > 0
        if self.has_shared_experts:
            self.shared_experts = Cohere2MoeMLP(config, config.intermediate_size * config.num_shared_experts)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the MLP's output `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        if self.has_shared_experts:
            out = out + self.shared_experts(tokens)
            if self.average:
                out = out / 2
        return out.reshape(hidden_states.shape), router_logits


class Cohere2MoeDecoderLayer(nn.Module):
    """Attention and the MLP (sparse, returning the layer's router logits too, or dense) in parallel off one norm:
    `x + attn(norm(x)) + mlp(norm(x))`."""

    def __init__(self, config: Cohere2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Cohere2MoeAttention(config, layer_idx)
        self.sparse = config.mlp_layer_types[layer_idx] == "sparse"
        self.mlp = (
            Cohere2MoeSparseMoeBlock(config)
            if self.sparse
            else Cohere2MoeMLP(config, config.prefix_dense_intermediate_size)
        )
        self.input_layernorm = norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        normed = self.input_layernorm(hidden_states)
        attn_output = self.self_attn(
            normed,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        if not self.sparse:
            return hidden_states + attn_output + self.mlp(normed), None
        mlp_output, router_logits = self.mlp(normed)
        return hidden_states + attn_output + mlp_output, router_logits


class Cohere2MoeExperts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__(config.num_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class Cohere2MoeTopKRouter(nn.Module):
    """Router logits `[tokens, experts]` (the model's dtype); each token's experts of the `num_experts_per_tok`
    largest logits, weighted by a float32 softmax over those logits or by their sigmoids (renormalised when
    `norm_topk_prob`), cast to the logits' dtype."""

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.expert_selection_fn = config.expert_selection_fn
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight)  # [tokens, experts]
        top_logits, top_k_index = torch.topk(router_logits, self.top_k, dim=-1)  # [tokens, top_k]
        if self.expert_selection_fn == "softmax":
            top_k_weights = F.softmax(top_logits, dim=-1, dtype=torch.float)
        else:
            top_k_weights = top_logits.sigmoid()
            if self.norm_topk_prob:
                top_k_weights = top_k_weights / top_k_weights.sum(dim=-1, keepdim=True)
        return router_logits, top_k_weights.to(hidden_states.dtype), top_k_index


class Cohere2MoePreTrainedModel(PreTrainedModel):
    config_class = Cohere2MoeConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (Cohere2MoeExperts, Cohere2MoeTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class Cohere2MoeModel(Cohere2MoePreTrainedModel):
    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Cohere2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = norm(config)
        self.rotary_emb = Cohere2MoeRotaryEmbedding(config)
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


class Cohere2MoeForCausalLM(MoeCausalLMMixin, Cohere2MoePreTrainedModel):
    """Upstream returns the router logits but computes no auxiliary loss for this model: neither do we."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered
    router_aux_loss: ClassVar[bool] = False

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__(config)
        self.model = Cohere2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.config.logit_scale  # [batch, q_len, vocab]


class Cohere2MoeRMSNorm(nn.Module):
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
