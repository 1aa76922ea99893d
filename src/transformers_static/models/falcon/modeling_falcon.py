"""Falcon: rotary or ALiBi positions, multi-query or grouped key/value heads in one fused projection, parallel
or sequential attention and MLP."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import AttentionMaskConverter, attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from .configuration_falcon import FalconConfig


class FalconLinear(nn.Linear):
    """nn.Linear with the bias added after the matmul, not fused into it: Falcon was trained this way (one more
    rounding in bf16), and upstream keeps it so the checkpoints' numerics hold. Parameters as nn.Linear's."""

    int8_layout = "out_in"  # the product, then the bias: as Int8Linear computes it

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # .t(), not .T: torch 2.13's nested_compile_region fails on a parameter's `.T` attribute (the layer body of
        # regional compilation: "Freevar has no source")
        hidden_states = hidden_states @ self.weight.t()
        return hidden_states if self.bias is None else hidden_states + self.bias


# Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding with Llama->Falcon
class FalconRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (scaled by YaRN's
    attention factor with rope_type "yarn")."""

    def __init__(self, config: FalconConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

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


# Copied from transformers_static.models.bloom.modeling_bloom.alibi_slopes
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


def build_alibi_bias(
    key_positions: torch.Tensor, slopes: torch.Tensor, head_dim: int, dtype: torch.dtype
) -> torch.Tensor:
    """Falcon's ALiBi score bias `[batch, heads, 1, kv_len]` in `dtype`, from `key_positions` `[batch, kv_len]` and
    `slopes` `[heads]`: `slope * key_position`, the product rounded to bfloat16 as upstream computes it, then cast
    and divided by `sqrt(head_dim)`, since Falcon scales the bias with the scores: `(q k + bias) / sqrt(head_dim)`.
    It depends on the key only; within a query's row that is `-slope * distance` up to a constant."""
    alibi = slopes.bfloat16()[None, :, None] * key_positions[:, None, :]  # [batch, heads, kv_len], bfloat16
    return alibi.to(dtype)[:, :, None, :] / math.sqrt(head_dim)  # [batch, heads, 1, kv_len]


class FalconMLP(nn.Module):
    def __init__(self, config: FalconConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = FalconLinear(config.hidden_size, config.ffn_hidden_size, bias=config.bias)
        self.act = get_activation(config.activation)
        self.dense_4h_to_h = FalconLinear(config.ffn_hidden_size, config.hidden_size, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class FalconAttention(nn.Module):
    """Self-attention over one fused `query_key_value` projection laid out `[kv_heads, q_per_kv + 2, head_dim]`.

    That one layout covers all of Falcon's: grouped (`new_decoder_architecture`, kv_heads = `num_kv_heads`),
    multi-query (kv_heads = 1: all queries, then one key, one value) and one key/value per head (kv_heads = heads:
    `[heads, 3, head_dim]`). The cache holds kv_heads heads (upstream's grouped layout stores each key once per
    query head; the kernels repeat them here instead, the same order). With ALiBi there is no rotary: the bias is
    already in `attention_mask`, scaled like the scores, so softmax sees `(q k + alibi) / sqrt(head_dim)`.
    """

    def __init__(self, config: FalconConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        # Upstream drops attention probabilities on its ALiBi path only.
        self.attention_dropout = config.attention_dropout if config.alibi else 0.0
        qkv_dim = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.query_key_value = FalconLinear(config.hidden_size, qkv_dim, bias=config.bias)
        self.dense = FalconLinear(config.hidden_size, config.hidden_size, bias=config.bias)

    def _split_heads(self, fused_qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`[batch, q_len, (heads + 2 kv_heads) head_dim]` -> query `[batch, heads, q_len, head_dim]`, key and
        value `[batch, kv_heads, q_len, head_dim]`."""
        batch, q_len, _ = fused_qkv.shape
        # All heads, or this rank's under tensor parallelism (a key/value head replicated when fewer than ranks).
        heads, kv_heads = len(self.config.tp_heads(self.num_heads)), len(self.config.tp_heads(self.num_kv_heads))
        q_per_kv = heads // kv_heads
        qkv = fused_qkv.view(batch, q_len, kv_heads, q_per_kv + 2, self.head_dim)
        query = qkv[:, :, :, :q_per_kv].reshape(batch, q_len, heads, self.head_dim)
        key, value = qkv[:, :, :, q_per_kv], qkv[:, :, :, q_per_kv + 1]  # [batch, q_len, kv_heads, head_dim]
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        query, key, value = self._split_heads(self.query_key_value(hidden_states))
        if position_embeddings is not None:
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
        return self.dense(attn_output)


class FalconDecoderLayer(nn.Module):
    """Parallel (`x + attn(ln(x)) + mlp(ln(x))`, with `ln_attn`/`ln_mlp` as two norms in the new decoder
    architecture) or sequential (`x + attn(ln(x))`, then `+ mlp(post_attention_layernorm(.))`)."""

    def __init__(self, config: FalconConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attention = FalconAttention(config, layer_idx)
        self.mlp = FalconMLP(config)
        self.parallel_attn = config.parallel_attn
        # The new decoder architecture gives attention and MLP a LayerNorm each, unless num_ln_in_parallel_attn=1.
        self.separate_norms = config.new_decoder_architecture and config.num_ln_in_parallel_attn in (None, 2)
        self.attention_dropout = config.attention_dropout  # upstream's residual dropout after sequential attention
        self.hidden_dropout = config.hidden_dropout
        hidden, eps = config.hidden_size, config.layer_norm_epsilon
        if self.separate_norms:
            self.ln_attn = nn.LayerNorm(hidden, eps=eps)
            self.ln_mlp = nn.LayerNorm(hidden, eps=eps)
        else:
            self.input_layernorm = nn.LayerNorm(hidden, eps=eps)
        if not self.parallel_attn:
            self.post_attention_layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        residual = hidden_states
        if self.separate_norms:
            attention_in, mlp_in = self.ln_attn(hidden_states), self.ln_mlp(hidden_states)
        else:
            attention_in = mlp_in = self.input_layernorm(hidden_states)
        attention_out = self.self_attention(
            attention_in,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        if self.parallel_attn:
            mlp_out = self.mlp(mlp_in) + attention_out
        else:
            residual = residual + F.dropout(attention_out, p=self.attention_dropout, training=self.training)
            mlp_out = self.mlp(self.post_attention_layernorm(residual))
        return residual + F.dropout(mlp_out, p=self.hidden_dropout, training=self.training)


class FalconPreTrainedModel(PreTrainedModel):
    config_class = FalconConfig
    base_model_prefix = "transformer"

    def __init__(self, config: FalconConfig) -> None:
        super().__init__(config)
        config.validate()


class FalconModel(FalconPreTrainedModel):
    def __init__(self, config: FalconConfig) -> None:
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.h = nn.ModuleList(FalconDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        self.rotary_emb = FalconRotaryEmbedding(config) if config.rotary else None
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
        """Final hidden states `[batch, q_len, hidden]`. With ALiBi the bias comes from the position of every key
        (the cache keeps them), so 4D masks, static caches and packed sequences work."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.word_embeddings)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
            with_key_positions=self.config.alibi,
        )
        position_embeddings = None
        if self.config.alibi:
            inputs = self._fold_alibi(inputs)
        else:
            position_embeddings = self.rotary_emb(inputs_embeds, inputs.position_ids)
        hidden_states = inputs_embeds
        for layer in self.h:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.ln_f(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)

    def _fold_alibi(self, inputs: AttentionInputs) -> AttentionInputs:
        """Fold the ALiBi bias of every key into every mask, which becomes additive `[batch, heads, q_len, kv_len]`."""
        num_heads = self.config.num_attention_heads
        heads = self.config.tp_heads(num_heads)  # all heads, or this rank's under tensor parallelism
        slopes = alibi_slopes(num_heads, self.device)[heads.start : heads.stop]  # [heads]
        bias = build_alibi_bias(inputs.key_positions, slopes, self.config.head_dim, self.dtype)
        masks = {kind: AttentionMaskConverter.with_bias(mask, bias, self.dtype) for kind, mask in inputs.masks.items()}
        return dataclasses.replace(inputs, masks=masks)


class FalconForCausalLM(CausalLMMixin, FalconPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "transformer.word_embeddings.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: FalconConfig) -> None:
        super().__init__(config)
        self.transformer = FalconModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
