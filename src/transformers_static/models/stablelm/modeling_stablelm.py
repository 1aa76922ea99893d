"""StableLM: Llama's grouped-query attention and SwiGLU MLP with LayerNorm blocks, rotary positions on the first
`rotary_ndims` dims of each head, optional q/k/v biases, an optional LayerNorm of its own for every query and key
head (`qk_layernorm`), and an optional parallel residual (`x + attn(ln(x)) + mlp(ln(x))`, one LayerNorm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
from .configuration_stablelm import StableLmConfig


# Copied from transformers_static.models.gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding with GPTNeoX->StableLm
class StableLmRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions, computed in float32: only the first
    `rotary_ndims` dims of each head rotate."""

    def __init__(self, config: StableLmConfig) -> None:
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


# Copied from transformers_static.models.mistral.modeling_mistral.MistralMLP with Mistral->StableLm
class StableLmMLP(nn.Module):
    def __init__(self, config: StableLmConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    # Copied from transformers_static.models.llama.modeling_llama.LlamaMLP.forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class StableLmLayerNormPerHead(nn.Module):
    """A bias-free LayerNorm of its own for each head (`norms.<head>.weight`, as checkpoints store them), applied to
    all heads at once: the shared normalisation, then each head's weight."""

    def __init__(self, config: StableLmConfig, num_heads: int) -> None:
        super().__init__()
        self.config = config
        self.eps = config.layer_norm_eps
        self.norms = nn.ModuleList(
            nn.LayerNorm(config.head_dim, eps=config.layer_norm_eps, bias=False) for _ in range(num_heads)
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`[batch, heads, q_len, head_dim]`, the heads this process computes (all, or its tensor-parallel share)."""
        heads = self.config.tp_heads(len(self.norms))
        weight = torch.stack([self.norms[head].weight for head in heads])  # [heads, head_dim]
        normed = F.layer_norm(hidden_states, hidden_states.shape[-1:], eps=self.eps)
        return normed * weight[:, None, :]


class StableLmAttention(nn.Module):
    """Grouped-query attention (q/k/v biases with `use_qkv_bias`, a bias-free `o_proj`), per-head q/k LayerNorms
    before the rotation (`qk_layernorm`), rotary positions on part of each head."""

    def __init__(self, config: StableLmConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.use_qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.use_qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.use_qkv_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)
        self.qk_layernorm = config.qk_layernorm
        if self.qk_layernorm:
            self.q_layernorm = StableLmLayerNormPerHead(config, config.num_attention_heads)
            self.k_layernorm = StableLmLayerNormPerHead(config, config.num_key_value_heads)

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
        return self.o_proj(attn_output)


class StableLmDecoderLayer(nn.Module):
    """Sequential: `h = x + attn(ln1(x))`, `h + mlp(ln2(h))`; parallel (`use_parallel_residual`, no
    `post_attention_layernorm`): `x + attn(ln1(x)) + mlp(ln1(x))`. Dropout on the MLP output only, as upstream."""

    def __init__(self, config: StableLmConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.use_parallel_residual = config.use_parallel_residual
        self.self_attn = StableLmAttention(config, layer_idx)
        self.mlp = StableLmMLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if not self.use_parallel_residual:
            self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

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
        if self.use_parallel_residual:
            return residual + attn_output + self.dropout(self.mlp(hidden_states))
        residual = residual + attn_output
        return residual + self.dropout(self.mlp(self.post_attention_layernorm(residual)))


class StableLmPreTrainedModel(PreTrainedModel):
    config_class = StableLmConfig
    base_model_prefix = "model"

    def __init__(self, config: StableLmConfig) -> None:
        super().__init__(config)
        config.validate()


class StableLmModel(StableLmPreTrainedModel):
    def __init__(self, config: StableLmConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(StableLmDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_emb = StableLmRotaryEmbedding(config)
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
        """Final hidden states `[batch, q_len, hidden]` (after `norm`)."""
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
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class StableLmForCausalLM(CausalLMMixin, StableLmPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: StableLmConfig) -> None:
        super().__init__(config)
        self.model = StableLmModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
