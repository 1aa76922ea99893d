# Generated from modular_doge.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Doge: Llama with dynamic mask attention (DMA) and learned residual scales. Queries and keys are RMS-normalised per
head before rotary; every key gets a score bias per key/value head computed from its value,
`exp(A * softplus(dt_proj(values)))`, folded into the converter's mask; when more than `keep_window_size` keys are
visible, each query keeps only the `keep_window_size` of largest bias. Each residual branch adds to
`input_residual * residual` (`post_attention_residual` for the MLP), with `hidden_dropout` on the branch.
The cross-domain mixture of experts (`is_moe`) is refused, and so is tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import AttentionMaskConverter, attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from .configuration_doge import DogeConfig


class DogeRMSNorm(nn.Module):
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


class DogeRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (scaled by YaRN's
    attention factor with rope_type "yarn")."""

    def __init__(self, config: DogeConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
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


class DogeMLP(nn.Module):
    def __init__(self, config: DogeConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DogeAttention(nn.Module):
    """Llama's attention with per-head query/key RMSNorms (before rotary) and the dynamic mask: a score bias per
    key and key/value head, `exp(A * softplus(dt_proj(values)))` `[batch, kv_heads, kv_len]`, computed from every
    value the layer attends (the cache's included), folded into the mask; a query that sees more than
    `keep_window_size` keys keeps the `keep_window_size` of largest bias."""

    def __init__(self, config: DogeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.keep_window_size = config.keep_window_size
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.A = nn.Parameter(torch.zeros(config.num_key_value_heads))  # [kv_heads]
        self.dt_proj = nn.Linear(kv_dim, config.num_key_value_heads, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = DogeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = DogeRMSNorm(self.head_dim, eps=config.rms_norm_eps)

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
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [batch, heads, q, d]
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [batch, kv_heads, q, d]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        key, value = update_kv_cache(self, key, value, cache_position=cache_position, past_key_values=past_key_values)
        attn_output = attend(
            self,
            query,
            key,
            value,
            self.dynamic_mask(value, attention_mask, query.shape[1] // key.shape[1]),
            scaling=self.scaling,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)

    def dynamic_mask(self, value: torch.Tensor, attention_mask: torch.Tensor, n_rep: int) -> torch.Tensor:
        """The additive mask `[batch, heads, q_len, kv_len]`: the converter's `attention_mask` `[batch, 1, q_len,
        kv_len]` with each key's bias (from `value` `[batch, kv_heads, kv_len, head_dim]`) where it may be attended,
        restricted to the `keep_window_size` keys of largest bias per query (ties to the earliest slot)."""
        dt = self.dt_proj(value.transpose(1, 2).flatten(2))  # [batch, kv_len, kv_heads]
        bias = torch.exp(self.A * F.softplus(dt)).transpose(1, 2)[:, :, None]  # [batch, kv_heads, 1, kv_len]
        mask = AttentionMaskConverter.with_bias(attention_mask, bias, value.dtype)  # [batch, kv_heads, q, kv_len]
        if mask.shape[-1] > self.keep_window_size:
            # the largest biases; among equal ones (repeated tokens give equal values, hence equal biases, in the first
            # layer) the earliest slots, so the choice does not depend on the cache's length (upstream's topk breaks
            # ties arbitrarily, differently for different key lengths)
            order = mask.sort(dim=-1, descending=True, stable=True).indices
            chosen = order[..., : self.keep_window_size]
            kept = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device).scatter(-1, chosen, True)
            mask = AttentionMaskConverter.with_bias(kept, mask, value.dtype)
        return mask.repeat_interleave(n_rep, dim=1)  # each query head reads its key/value head's row


class DogeDecoderLayer(nn.Module):
    def __init__(self, config: DogeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.hidden_dropout = config.hidden_dropout
        self.input_layernorm = DogeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DogeAttention(config, layer_idx)
        self.input_residual = nn.Parameter(torch.ones(config.hidden_size))
        self.post_attention_layernorm = DogeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = DogeMLP(config)
        self.post_attention_residual = nn.Parameter(torch.ones(config.hidden_size))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = F.dropout(hidden_states, p=self.hidden_dropout, training=self.training)
        hidden_states = self.input_residual * residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        hidden_states = F.dropout(hidden_states, p=self.hidden_dropout, training=self.training)
        return self.post_attention_residual * residual + hidden_states


class DogePreTrainedModel(PreTrainedModel):
    config_class = DogeConfig
    base_model_prefix = "model"


class DogeModel(DogePreTrainedModel):
    def __init__(self, config: DogeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(DogeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DogeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = DogeRotaryEmbedding(config)
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
    ) -> BaseModelOutputWithPast:
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
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class DogeForCausalLM(CausalLMMixin, DogePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: DogeConfig) -> None:
        super().__init__(config)
        self.model = DogeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
