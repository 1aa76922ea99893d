"""MPT: ALiBi position biases (no position embeddings), one fused `Wqkv` (optionally clipped), no biases anywhere
(LayerNorms included), pre-LayerNorm blocks with an exact-GELU MLP.

The ALiBi bias comes from every key slot's position (kept by the cache) and is folded into the mask once per
forward, so every mask form and a StaticCache work. Upstream builds it from key slot indices relative to the last
key, which is the same bias up to a constant per row (ALiBi only sees differences within a row)."""

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
from .configuration_mpt import MptConfig


def mpt_alibi_slopes(num_heads: int, alibi_bias_max: float = 8, device: torch.device | None = None) -> torch.Tensor:
    """MPT's ALiBi slope of each head, float32 `[heads]`: for `n` the power of two >= `num_heads`, the slopes
    `2^(-alibi_bias_max * i / n)` for i = 1..n; with fewer heads than `n`, the odd-indexed ones first, then the
    even-indexed ones, the first `num_heads` kept (MosaicML's order, which differs from Bloom's)."""
    padded = 2 ** math.ceil(math.log2(num_heads))
    exponents = torch.arange(1, padded + 1, dtype=torch.int64, device=device).float() * (alibi_bias_max / padded)
    slopes = 1.0 / torch.pow(2, exponents)  # [padded]
    if padded != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


# Copied from transformers_static.models.bloom.modeling_bloom.build_alibi_bias
def build_alibi_bias(key_positions: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """The score bias `slopes[h] * key_position`, float32 `[batch, heads, 1, kv_len]`, from `key_positions`
    `[batch, kv_len]` and `slopes` `[heads]`. It depends on the key only: within a query's row that is
    `-slope * distance` up to a constant, which softmax ignores."""
    return slopes[None, :, None, None] * key_positions[:, None, None, :]  # [batch, heads, 1, kv_len]


class MptAttention(nn.Module):
    """Self-attention over one `Wqkv` laid out `[q | k | v]`, each `[heads, head_dim]`, clamped to
    `[-clip_qkv, clip_qkv]` when `attn_config.clip_qkv` is set. Scores are `q k * softmax_scale` (default
    `1 / sqrt(head_dim)`) plus the ALiBi bias, which arrives folded into `attention_mask` (additive,
    `[batch, heads, q_len, kv_len]`), unscaled."""

    def __init__(self, config: MptConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.hidden_size = config.d_model
        self.head_dim = config.d_model // config.n_heads
        softmax_scale = config.attn_config.softmax_scale
        self.scaling = 1 / math.sqrt(self.head_dim) if softmax_scale is None else softmax_scale
        self.clip_qkv = config.attn_config.clip_qkv
        self.attention_dropout = config.attn_config.attn_pdrop
        self.Wqkv = nn.Linear(self.hidden_size, 3 * self.hidden_size, bias=False)
        self.out_proj = nn.Linear(self.hidden_size, self.hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        mixed_qkv = self.Wqkv(hidden_states)  # [batch, q_len, 3 * heads * head_dim]
        if self.clip_qkv:  # upstream's test: 0 and None both mean no clipping
            mixed_qkv = mixed_qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query, key, value = (x.view(hidden_shape).transpose(1, 2) for x in mixed_qkv.chunk(3, dim=-1))
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
        return self.out_proj(attn_output)


class MptMLP(nn.Module):
    """`down_proj(gelu(up_proj(x)))`, exact GELU, 4 * d_model wide; dropped out with `attn_config.attn_pdrop`
    (upstream's choice), then added to the residual."""

    def __init__(self, config: MptConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.d_model, 4 * config.d_model, bias=False)
        self.act = nn.GELU(approximate="none")
        self.down_proj = nn.Linear(4 * config.d_model, config.d_model, bias=False)
        self.hidden_dropout = config.attn_config.attn_pdrop

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        output = self.down_proj(self.act(self.up_proj(hidden_states)))
        return F.dropout(output, p=self.hidden_dropout, training=self.training) + residual


class MptBlock(nn.Module):
    """Pre-LayerNorm block: `x + attn(norm_1(x))`, then `+ ffn(norm_2(.))`; LayerNorms without bias."""

    def __init__(self, config: MptConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.norm_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon, bias=False)
        self.attn = MptAttention(config, layer_idx)
        self.norm_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon, bias=False)
        self.ffn = MptMLP(config)
        self.resid_attn_dropout = nn.Dropout(config.attn_config.attn_pdrop)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        attn_output = self.attn(
            self.norm_1(hidden_states),
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = self.resid_attn_dropout(attn_output) + hidden_states
        return self.ffn(self.norm_2(hidden_states), hidden_states)


class MptPreTrainedModel(PreTrainedModel):
    config_class = MptConfig
    base_model_prefix = "transformer"

    def __init__(self, config: MptConfig) -> None:
        super().__init__(config)
        config.validate()


class MptModel(MptPreTrainedModel):
    def __init__(self, config: MptConfig) -> None:
        super().__init__(config)
        self.num_heads = config.n_heads
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(MptBlock(config, i) for i in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon, bias=False)
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
        `cache_position`); only differences within a row matter. Upstream takes no `position_ids`."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.wte)  # [batch, q_len, hidden]
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
        heads = self.config.tp_heads(self.num_heads)  # all heads, or this rank's under tensor parallelism
        slopes = mpt_alibi_slopes(self.num_heads, self.config.attn_config.alibi_bias_max, inputs_embeds.device)
        alibi = build_alibi_bias(inputs.key_positions, slopes[heads.start : heads.stop])
        masks = {
            kind: AttentionMaskConverter.with_bias(mask, alibi, inputs_embeds.dtype)
            for kind, mask in inputs.masks.items()
        }  # per kind: [batch, heads, q_len, kv_len], additive
        inputs = dataclasses.replace(inputs, masks=masks)
        hidden_states = inputs_embeds
        for block in self.blocks:
            hidden_states = block(hidden_states, inputs)
        hidden_states = self.norm_f(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class MptForCausalLM(CausalLMMixin, MptPreTrainedModel):
    """MPT with a language-model head without bias, tied to the token embeddings by default."""

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: MptConfig) -> None:
        super().__init__(config)
        self.transformer = MptModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
