"""Flint: Qwen3-MoE's attention (per-head q/k RMSNorms, `attention_bias`) with learned sinks (one more logit per
head in each query's softmax, dropped after it), sliding-window layers beside full ones (`config.layer_types`, one
mask per kind made once per forward) and rotary positions on the sliding layers only (the full layers have no
position encoding, as upstream); gpt-oss's RMSNorm (the weight multiplied in float32); sparse layers (off
`mlp_only_layers`, on the `decoder_sparse_step` interval) whose router takes the sigmoid of float32 logits (its
weight kept float32, as upstream's `_keep_in_fp32_modules_strict`, and so are the sinks), top-k renormalised with
`norm_topk_prob`, plus an ungated shared expert; the other layers a dense MLP.

The sinks need the eager kernel (sdpa has no column to add): sdpa is refused, as upstream. The experts are stacked
parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`, beside `mlp.gate.weight` and `mlp.shared_expert.*`; the sinks are `self_attn.softmax_offset` there (upstream
renames them on load, and back on save).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, rename_tensor_in_checkpoint
from .configuration_flint import FlintConfig


# Copied from transformers_static.models.gpt_oss.modeling_gpt_oss.GptOssRMSNorm with GptOss->Flint
class FlintRMSNorm(nn.Module):
    """RMSNorm whose weight multiplies in float32, before casting back. In a float16 model the weight itself stays
    float32, as upstream keeps it (`_keep_in_fp32_modules`, float16 only)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        dtype = torch.float32 if torch.get_default_dtype() == torch.float16 else None  # the model's, while built
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


# Copied from transformers_static.models.afmoe.modeling_afmoe.AfmoeRotaryEmbedding with Afmoe->Flint
class FlintRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (scaled by YaRN's
    attention factor with rope_type "yarn")."""

    def __init__(self, config: FlintConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.forward
    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


# Copied from transformers_static.models.llama.modeling_llama.rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# Copied from transformers_static.models.llama.modeling_llama.apply_rotary_pos_emb
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# Copied from transformers_static.models.afmoe.modeling_afmoe.AfmoeMLP with Afmoe->Flint
class FlintMLP(nn.Module):
    """SwiGLU MLP of width `intermediate_size` (default: the config's dense width)."""

    def __init__(self, config: FlintConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        intermediate_size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    # Copied from transformers_static.models.llama.modeling_llama.LlamaMLP.forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


# Copied from transformers_static.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts with Qwen3Moe->Flint
class FlintExperts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `moe_intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: FlintConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    # Copied from transformers_static.models.mixtral.modeling_mixtral.MixtralExperts.glu
    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class FlintTopKRouter(nn.Module):
    """Router logits `[tokens, experts]` in float32 (the weight kept float32 whatever the model's dtype); each
    token's top-k experts by sigmoid score, weighted by their scores (float32), renormalised when
    `norm_topk_prob`."""

    def __init__(self, config: FlintConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, dtype=torch.float32))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.float(), self.weight.float())  # [tokens, experts]
        top_k_weights, top_k_index = torch.topk(router_logits.sigmoid(), self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_k_weights = top_k_weights / top_k_weights.sum(dim=-1, keepdim=True)
        return router_logits, top_k_weights, top_k_index


class FlintSparseMoeBlock(nn.Module):
    """The routed experts' weighted sum plus the shared expert, ungated."""

    def __init__(self, config: FlintConfig) -> None:
        super().__init__()
        self.experts = FlintExperts(config)
        self.gate = FlintTopKRouter(config)
        self.shared_expert = FlintMLP(config, intermediate_size=config.shared_expert_intermediate_size)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> `[batch, q_len, hidden]` and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights) + self.shared_expert(tokens)
        return out.reshape(hidden_states.shape), router_logits


class FlintAttention(nn.Module):
    """Qwen3-MoE's attention with a learned sink logit per head (`sinks` `[heads]`, float32) joining each query's
    softmax; rotary positions on the sliding layers only."""

    def __init__(self, config: FlintConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_local_attention = config.layer_types[layer_idx] == SLIDING_ATTENTION
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = FlintRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = FlintRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.sinks = nn.Parameter(torch.empty(config.num_attention_heads, dtype=torch.float32))  # [heads]
        rename_tensor_in_checkpoint(self, "sinks", "softmax_offset")  # upstream's checkpoint name

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
        # Normed per head on [batch, q_len, heads, head_dim], then [batch, heads, q_len, head_dim].
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [.., kv_heads, ..]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        if self.is_local_attention:  # the full layers have no position encoding
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


# Copied from transformers_static.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeDecoderLayer with Qwen3Moe->Flint
class FlintDecoderLayer(nn.Module):
    """Attention, then the sparse MLP (returning the layer's router logits too) or, off the sparse layers, a dense
    one (no router logits)."""

    def __init__(self, config: FlintConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = FlintAttention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = FlintSparseMoeBlock(config) if self.sparse else FlintMLP(config)
        self.input_layernorm = FlintRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = FlintRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        normed = self.post_attention_layernorm(hidden_states)
        if not self.sparse:
            return hidden_states + self.mlp(normed), None
        mlp_output, router_logits = self.mlp(normed)
        return hidden_states + mlp_output, router_logits


class FlintPreTrainedModel(PreTrainedModel):
    config_class = FlintConfig
    base_model_prefix = "model"

    def __init__(self, config: FlintConfig) -> None:
        super().__init__(config)
        if config._attn_implementation == "sdpa":
            raise ValueError(
                "Flint adds a learned sink logit per head to the attention softmax, which sdpa cannot do: use "
                "attn_implementation='eager', this model's default (upstream refuses sdpa for Flint too)"
            )

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts, the router and the sinks normal."""
        super()._init_module(module)
        if isinstance(module, (FlintExperts, FlintTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)
        elif isinstance(module, FlintAttention):
            nn.init.normal_(module.sinks, std=self.config.initializer_range)


# Copied from transformers_static.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeModel with Qwen3Moe->Flint
class FlintModel(FlintPreTrainedModel):
    def __init__(self, config: FlintConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(FlintDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = FlintRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = FlintRotaryEmbedding(config)
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


class FlintForCausalLM(MoeCausalLMMixin, FlintPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: FlintConfig) -> None:
        super().__init__(config)
        self.model = FlintModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
