"""Phi: partial rotary positions, optional query/key LayerNorm, and a parallel block (attention and MLP both read
one LayerNorm's output and are added to the residual together)."""

from __future__ import annotations

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from .configuration_phi import PhiConfig, head_dim, rotary_ndims


class PhiRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions, computed in float32: only the first
    `rotary_ndims = int(head_dim * partial_rotary_factor)` dims of each head rotate."""

    def __init__(self, config: PhiConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, rotary_ndims(config), config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_ndims // 2]

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.forward with head_dim->rotary_ndims
    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, rotary_ndims // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, rotary_ndims]
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


# Copied from transformers_static.models.gpt_neox.modeling_gpt_neox.apply_partial_rotary_pos_emb
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


class PhiMLP(nn.Module):
    def __init__(self, config: PhiConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation_fn = get_activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))


class PhiAttention(nn.Module):
    """Grouped-query attention with biased projections, an output projection named `dense`, optional LayerNorm of
    each query/key head (`qk_layernorm`, before the rotation) and rotary positions on part of each head."""

    def __init__(self, config: PhiConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim)
        self.dense = nn.Linear(q_dim, config.hidden_size)
        self.qk_layernorm = config.qk_layernorm
        if self.qk_layernorm:
            self.q_layernorm = nn.LayerNorm(self.head_dim, eps=config.layer_norm_eps)
            self.k_layernorm = nn.LayerNorm(self.head_dim, eps=config.layer_norm_eps)

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
        if self.qk_layernorm:
            query, key = self.q_layernorm(query), self.k_layernorm(key)

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
        return self.dense(attn_output)


class PhiDecoderLayer(nn.Module):
    """Parallel block: `x + dropout(attn(ln(x))) + dropout(mlp(ln(x)))`, one LayerNorm for both branches."""

    def __init__(self, config: PhiConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = PhiAttention(config, layer_idx)
        self.mlp = PhiMLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        attn_output = self.self_attn(
            hidden_states,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        mlp_output = self.mlp(hidden_states)
        return self.resid_dropout(attn_output) + self.resid_dropout(mlp_output) + residual


class PhiPreTrainedModel(PreTrainedModel):
    config_class = PhiConfig
    base_model_prefix = "model"


class PhiModel(PhiPreTrainedModel):
    def __init__(self, config: PhiConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(PhiDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.rotary_emb = PhiRotaryEmbedding(config)
        self.embed_dropout = nn.Dropout(config.embd_pdrop)
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
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
        """Final hidden states `[batch, q_len, hidden]` (after `final_layernorm`)."""
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
        hidden_states = self.embed_dropout(inputs_embeds)
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)  # each [batch, q_len, rotary_ndims]
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.final_layernorm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class PhiForCausalLM(CausalLMMixin, PhiPreTrainedModel):
    """Phi with its language-model head. The head has a bias (`lm_head.bias`), which the shared forward applies as
    part of `nn.Linear`; tying (`tie_word_embeddings`) shares only the weight, as upstream."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: PhiConfig) -> None:
        super().__init__(config)
        self.model = PhiModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.post_init()
