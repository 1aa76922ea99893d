"""Persimmon: query/key/value packed per head in one projection, a LayerNorm over each query and key head (one
norm shared by all heads, `qk_layernorm`), rotary positions on the first `rotary_ndims` dims of each head, and
sequential LayerNorm blocks with a squared-ReLU (`relu2`) MLP (`dense_h_to_4h` / `dense_4h_to_h`)."""

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
from .configuration_persimmon import PersimmonConfig


# Copied from transformers_static.models.gpt_neox.modeling_gpt_neox.GPTNeoXMLP with GPTNeoX->Persimmon
class PersimmonMLP(nn.Module):
    def __init__(self, config: PersimmonConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, config.intermediate_size)
        self.dense_4h_to_h = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = get_activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(hidden_states)))


# Copied from transformers_static.models.gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding with GPTNeoX->Persimmon
class PersimmonRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions, computed in float32: only the first
    `rotary_ndims` dims of each head rotate."""

    def __init__(self, config: PersimmonConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, config.rotary_ndims, config.max_position_embeddings
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


class PersimmonAttention(nn.Module):
    """Self-attention over one biased `query_key_value` projection packed per head (for each head its query, key
    and value side by side, `[heads, 3, head_dim]`), a LayerNorm of each query and key head before the rotation
    (`qk_layernorm`), and a biased output projection `dense`."""

    def __init__(self, config: PersimmonConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=True)
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
        qkv = self.query_key_value(hidden_states).view(batch, q_len, -1, 3 * self.head_dim)
        qkv = qkv.transpose(1, 2)  # [batch, heads, q_len, 3 * head_dim]
        query, key, value = qkv.chunk(3, dim=-1)  # each [batch, heads, q_len, head_dim]
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


class PersimmonDecoderLayer(nn.Module):
    """`h = x + attn(ln1(x))`, then `h + dropout(mlp(ln2(h)))`."""

    def __init__(self, config: PersimmonConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = PersimmonAttention(config, layer_idx)
        self.mlp = PersimmonMLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        return hidden_states + self.dropout(self.mlp(self.post_attention_layernorm(hidden_states)))


class PersimmonPreTrainedModel(PreTrainedModel):
    config_class = PersimmonConfig
    base_model_prefix = "model"

    def __init__(self, config: PersimmonConfig) -> None:
        super().__init__(config)
        config.validate()


class PersimmonModel(PersimmonPreTrainedModel):
    def __init__(self, config: PersimmonConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(PersimmonDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_emb = PersimmonRotaryEmbedding(config)
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
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)  # each [batch, q_len, rotary_ndims]
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.final_layernorm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class PersimmonForCausalLM(CausalLMMixin, PersimmonPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: PersimmonConfig) -> None:
        super().__init__(config)
        self.model = PersimmonModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
