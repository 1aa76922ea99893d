# Generated from modular_flex_olmo.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""FlexOlmo (FlexOlmo-7x7B-1T): OLMoE's sparse MLP on every layer (a softmax router picks `num_experts_per_tok` of
`num_experts` experts of width `intermediate_size` per token, renormalised over the chosen ones only with
`norm_topk_prob`) in OLMo 2's blocks: each sublayer reads the raw residual stream and its output is RMSNormed before
it is added back (`post_attention_layernorm`, `post_feedforward_layernorm`; no input norm), queries and keys are
RMSNormed over their whole projections (all heads at once, before the split into heads and the rotation), and the
norms and the rotation are computed in float32 and cast back afterwards, as OLMo 2. No `clip_qkv`, no window.

The experts are stacked parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
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
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, softmax_top_k
from .configuration_flex_olmo import FlexOlmoConfig


class FlexOlmoRMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back after the scaling (OLMoE casts before it)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


def head_dim(config: FlexOlmoConfig) -> int:
    """A config.json's `head_dim`, else `hidden_size // num_attention_heads` (not a field of upstream's config)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class FlexOlmoRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, in float32 whatever the model dtype (the
    rotation is computed in float32 and cast back, as OLMo 2)."""

    def __init__(self, config: FlexOlmoConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, head_dim(config), config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by float32 cos/sin `[batch, q_len, head_dim]`;
    the results are cast back to the queries' and keys' dtypes."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    q_embed = q * cos + rotate_half(q) * sin
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


class FlexOlmoExperts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: FlexOlmoConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class FlexOlmoTopKRouter(nn.Module):
    """Router logits `[tokens, experts]`; each token's top-k experts by softmax probability (float32), renormalised
    when `norm_topk_prob`, then in the logits' dtype."""

    def __init__(self, config: FlexOlmoConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight)  # [tokens, experts]
        top_k_weights, top_k_index = softmax_top_k(router_logits, self.top_k, normalize=self.norm_topk_prob)
        return router_logits, top_k_weights.to(router_logits.dtype), top_k_index


class FlexOlmoSparseMoeBlock(nn.Module):
    def __init__(self, config: FlexOlmoConfig) -> None:
        super().__init__()
        self.experts = FlexOlmoExperts(config)
        self.gate = FlexOlmoTopKRouter(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class FlexOlmoAttention(nn.Module):
    """Llama's attention (biases on all four projections with `attention_bias`) with `q_norm` and `k_norm`, RMSNorms
    over the whole query and key projections `[heads * head_dim]`, applied before the split into heads.

    Under tensor parallelism q_proj and k_proj are replicated (the norms need every head) and each rank keeps its own
    heads after the norms; v_proj and o_proj are split by heads."""

    def __init__(self, config: FlexOlmoConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = FlexOlmoRMSNorm(q_dim, eps=config.rms_norm_eps)
        self.k_norm = FlexOlmoRMSNorm(kv_dim, eps=config.rms_norm_eps)

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
        # All heads, or this rank's under tensor parallelism (a key/value head replicated when fewer than ranks).
        heads, kv_heads = self.config.tp_heads(self.num_heads), self.config.tp_heads(self.num_kv_heads)
        query = self.q_norm(self.q_proj(hidden_states)).view(batch, q_len, self.num_heads, self.head_dim)
        key = self.k_norm(self.k_proj(hidden_states)).view(batch, q_len, self.num_kv_heads, self.head_dim)
        query = query[:, :, heads.start : heads.stop].transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = key[:, :, kv_heads.start : kv_heads.stop].transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

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
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class FlexOlmoDecoderLayer(nn.Module):
    """`h = x + norm(attn(x))`, then `h + norm(moe(h))`: no norm on a sublayer's input (OLMo 2's blocks)."""

    def __init__(self, config: FlexOlmoConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = FlexOlmoAttention(config, layer_idx)
        self.mlp = FlexOlmoSparseMoeBlock(config)
        self.post_attention_layernorm = FlexOlmoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = FlexOlmoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_output = self.self_attn(
            hidden_states,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_output)
        mlp_output, router_logits = self.mlp(hidden_states)
        return hidden_states + self.post_feedforward_layernorm(mlp_output), router_logits


class FlexOlmoPreTrainedModel(PreTrainedModel):
    config_class = FlexOlmoConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (FlexOlmoExperts, FlexOlmoTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class FlexOlmoModel(FlexOlmoPreTrainedModel):
    def __init__(self, config: FlexOlmoConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(FlexOlmoDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = FlexOlmoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = FlexOlmoRotaryEmbedding(config)
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


class FlexOlmoForCausalLM(MoeCausalLMMixin, FlexOlmoPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: FlexOlmoConfig) -> None:
        super().__init__(config)
        self.model = FlexOlmoModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
