"""Bloom: ALiBi position biases (no position embeddings), an embedding LayerNorm, QKV fused per head, bias-GELU.

The ALiBi bias comes from every key slot's position (kept by the cache) and is folded into the mask once per
forward, so every mask form and a StaticCache work (docs/ARCHITECTURE.md, "Differences from upstream")."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import AttentionMaskConverter, attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_utils import PreTrainedModel
from .configuration_bloom import BloomConfig


def alibi_slopes(num_heads: int, device: torch.device | None = None) -> torch.Tensor:
    """ALiBi slope of each head, float32 `[heads]`, as in the ALiBi paper and upstream.

    For `n` the largest power of two <= `num_heads`, the first `n` heads take `b, b^2, ..., b^n` with
    `b = 2^(-8/n)`; any remaining heads take the odd powers `c, c^3, c^5, ...` of `c = 2^(-4/n)` (every other
    slope of the sequence for `2n` heads).
    """
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2.0 ** (-8.0 / closest), dtype=torch.float32, device=device)
    slopes = torch.pow(base, torch.arange(1, closest + 1, dtype=torch.int32, device=device))
    if closest == num_heads:
        return slopes
    extra_base = torch.tensor(2.0 ** (-4.0 / closest), dtype=torch.float32, device=device)
    extra_powers = torch.arange(1, 2 * (num_heads - closest), 2, dtype=torch.int32, device=device)
    return torch.cat([slopes, torch.pow(extra_base, extra_powers)])


def build_alibi_bias(key_positions: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """The score bias `slopes[h] * key_position`, float32 `[batch, heads, 1, kv_len]`, from `key_positions`
    `[batch, kv_len]` and `slopes` `[heads]`. It depends on the key only: within a query's row that is
    `-slope * distance` up to a constant, which softmax ignores."""
    return slopes[None, :, None, None] * key_positions[:, None, None, :]  # [batch, heads, 1, kv_len]


def bloom_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of GELU, with the constants Bloom was trained with (Megatron-DeepSpeed's)."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class BloomGelu(nn.Module):
    """`bloom_gelu` as a module (upstream's `gelu_impl`; no parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bloom_gelu(x)


class BloomMLP(nn.Module):
    def __init__(self, config: BloomConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config.hidden_size, 4 * config.hidden_size)
        self.gelu_impl = BloomGelu()
        self.dense_4h_to_h = nn.Linear(4 * config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.gelu_impl(self.dense_h_to_4h(hidden_states)))


class BloomAttention(nn.Module):
    """Self-attention over one `query_key_value` projection laid out per head: `[heads, 3, head_dim]`.

    The ALiBi bias arrives folded into `attention_mask` (`[batch, heads, q_len, kv_len]`, additive) and is added to
    the scaled scores unscaled, as upstream's `alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(head_dim))` does.
    """

    def __init__(self, config: BloomConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.hidden_size = config.hidden_size
        self.num_heads = config.n_head
        self.head_dim = config.hidden_size // config.n_head
        self.scaling = 1.0 / math.sqrt(self.head_dim)
        self.attention_dropout = config.attention_dropout
        self.query_key_value = nn.Linear(self.hidden_size, 3 * self.hidden_size, bias=True)
        self.dense = nn.Linear(self.hidden_size, self.hidden_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        fused_qkv = self.query_key_value(hidden_states).view(batch, q_len, -1, 3, self.head_dim)
        query, key, value = fused_qkv.permute(3, 0, 2, 1, 4).unbind(0)  # each [batch, heads, q_len, head_dim]
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


class BloomBlock(nn.Module):
    """Pre-LayerNorm block; with `apply_residual_connection_post_layernorm` the residual is the normed input."""

    def __init__(self, config: BloomConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.self_attention = BloomAttention(config, layer_idx)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.mlp = BloomMLP(config)
        self.apply_residual_connection_post_layernorm = config.apply_residual_connection_post_layernorm
        self.hidden_dropout = config.hidden_dropout

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        normed = self.input_layernorm(hidden_states)
        residual = normed if self.apply_residual_connection_post_layernorm else hidden_states
        attn_output = self.self_attention(
            normed,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + F.dropout(attn_output, p=self.hidden_dropout, training=self.training)
        normed = self.post_attention_layernorm(hidden_states)
        residual = normed if self.apply_residual_connection_post_layernorm else hidden_states
        return residual + F.dropout(self.mlp(normed), p=self.hidden_dropout, training=self.training)


class BloomPreTrainedModel(PreTrainedModel):
    config_class = BloomConfig
    base_model_prefix = "transformer"

    def __init__(self, config: BloomConfig) -> None:
        super().__init__(config)
        config.validate()


class BloomModel(BloomPreTrainedModel):
    def __init__(self, config: BloomConfig) -> None:
        super().__init__(config)
        self.num_heads = config.n_head
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.word_embeddings_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.h = nn.ModuleList(BloomBlock(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
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
        """Final hidden states `[batch, q_len, hidden]`. The ALiBi bias uses every key slot's position: the
        `position_ids` of the tokens stored in the cache (default: from the 2D padding mask's cumsum, else from
        `cache_position`); only differences within a row matter, so a constant shift per row changes nothing."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.word_embeddings)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
            with_key_positions=True,
        )
        hidden_states = self.word_embeddings_layernorm(inputs_embeds)
        heads = self.config.tp_heads(self.num_heads)  # all heads, or this rank's under tensor parallelism
        slopes = alibi_slopes(self.num_heads, hidden_states.device)[heads.start : heads.stop]
        alibi = build_alibi_bias(inputs.key_positions, slopes)
        masks = {
            kind: AttentionMaskConverter.with_bias(mask, alibi, hidden_states.dtype)
            for kind, mask in inputs.masks.items()
        }  # per kind: [batch, heads, q_len, kv_len], additive
        inputs = dataclasses.replace(inputs, masks=masks)
        for block in self.h:
            hidden_states = block(hidden_states, inputs)
        hidden_states = self.ln_f(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class BloomForCausalLM(CausalLMMixin, BloomPreTrainedModel):
    """Bloom with a language-model head, tied to the token embeddings by default (`tie_word_embeddings`)."""

    _tied_weights_keys = {"lm_head.weight": "transformer.word_embeddings.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: BloomConfig) -> None:
        super().__init__(config)
        self.transformer = BloomModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
