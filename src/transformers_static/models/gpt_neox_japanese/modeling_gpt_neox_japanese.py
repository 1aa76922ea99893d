"""GPT-NeoX-Japanese: GPT-NeoX's attention (query/key/value packed per head, rotary positions over the first
`rotary_ndims` dims of each head) with no biases on any projection, a sequential residual, and one extra bias,
the last layer's `dense_bias`, added to that layer's attention output before its residual."""

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
from .configuration_gpt_neox_japanese import GPTNeoXJapaneseConfig


# Copied from transformers_static.models.gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding with GPTNeoX->GPTNeoXJapanese
class GPTNeoXJapaneseRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions, computed in float32: only the first
    `rotary_ndims` dims of each head rotate."""

    def __init__(self, config: GPTNeoXJapaneseConfig) -> None:
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


class GPTNeoXJapaneseAttention(nn.Module):
    """GPT-NeoX's per-head packed self-attention without biases; with `use_bias` (the last layer) it holds
    `dense_bias`, which the layer adds to the output (upstream returns it beside the output)."""

    def __init__(self, config: GPTNeoXJapaneseConfig, layer_idx: int, use_bias: bool = False) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_size = config.head_dim
        self.scaling = self.head_size**-0.5
        self.attention_dropout = config.attention_dropout
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.dense_bias = nn.Parameter(torch.zeros(config.hidden_size)) if use_bias else None

    # Copied from transformers_static.models.gpt_neox.modeling_gpt_neox.GPTNeoXAttention.forward
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(batch, q_len, -1, 3 * self.head_size)
        qkv = qkv.transpose(1, 2)  # [batch, heads, q_len, 3 * head_dim]
        query, key, value = qkv.chunk(3, dim=-1)  # each [batch, heads, q_len, head_dim]

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


class GPTNeoXJapaneseMLP(nn.Module):
    """`dense_4h_to_h(act(dense_h_to_4h(x)))`, `hidden_size * intermediate_multiple_size` wide, no biases."""

    def __init__(self, config: GPTNeoXJapaneseConfig) -> None:
        super().__init__()
        intermediate_size = int(config.hidden_size * config.intermediate_multiple_size)
        self.dense_h_to_4h = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.dense_4h_to_h = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act = get_activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(hidden_states)))


class GPTNeoXJapaneseLayer(nn.Module):
    """Sequential residual: `h = x + dropout(attn(ln1(x)) [+ dense_bias])`, then `h + dropout(mlp(ln2(h)))`."""

    def __init__(self, config: GPTNeoXJapaneseConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        use_bias = layer_idx == config.num_hidden_layers - 1
        self.attention = GPTNeoXJapaneseAttention(config, layer_idx, use_bias=use_bias)
        self.mlp = GPTNeoXJapaneseMLP(config)
        self.hidden_dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.attention(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        if self.attention.dense_bias is not None:
            attn_output = attn_output + self.attention.dense_bias
        hidden_states = hidden_states + self.hidden_dropout(attn_output)
        return hidden_states + self.hidden_dropout(self.mlp(self.post_attention_layernorm(hidden_states)))


class GPTNeoXJapanesePreTrainedModel(PreTrainedModel):
    config_class = GPTNeoXJapaneseConfig
    base_model_prefix = "gpt_neox_japanese"
    # Older checkpoints (abeja's, converted before these buffers stopped being saved) hold the causal-mask buffers
    # and each layer's rotary inverse frequencies.
    _keys_to_ignore_on_load_unexpected = [
        r"\.attention\.bias$",
        r"\.attention\.masked_bias$",
        r"\.attention\.rotary_emb\.inv_freq$",
    ]

    def __init__(self, config: GPTNeoXJapaneseConfig) -> None:
        super().__init__(config)
        config.validate()


class GPTNeoXJapaneseModel(GPTNeoXJapanesePreTrainedModel):
    def __init__(self, config: GPTNeoXJapaneseConfig) -> None:
        super().__init__(config)
        self.embed_in = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GPTNeoXJapaneseLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_emb = GPTNeoXJapaneseRotaryEmbedding(config)
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
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_in)  # [batch, q_len, hidden]
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
        hidden_states = self.final_layer_norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class GPTNeoXJapaneseForCausalLM(CausalLMMixin, GPTNeoXJapanesePreTrainedModel):
    """GPT-NeoX-Japanese with its output projection `embed_out` (upstream's name, in checkpoints and in memory),
    tied to the token embeddings by default; `lm_head` is the same module under the name CausalLMMixin calls."""

    _tied_weights_keys = {"embed_out.weight": "gpt_neox_japanese.embed_in.weight"}
    _tp_plan = {"embed_out": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: GPTNeoXJapaneseConfig) -> None:
        super().__init__(config)
        self.gpt_neox_japanese = GPTNeoXJapaneseModel(config)
        self.embed_out = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @property
    def lm_head(self) -> nn.Linear:
        return self.embed_out
