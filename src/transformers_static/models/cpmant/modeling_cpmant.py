"""CPM-Ant: pre-RMSNorm blocks without biases, a gated-GELU FFN, and no position embeddings: a learned score bias
per head (T5-style) from a bucket of each key's position minus the query's (bidirectional buckets, logarithmic
beyond a quarter of them) when query and key share a segment, else one bucket per segment pair. Every sequence is
preceded by a learned prompt of `prompt_length` tokens (segment 0; the inputs are segment 2), whose outputs are
dropped.

On the static contract:
- the relative bias is built once per forward from `position_ids` (queries) and the positions the cache recorded
  for every key slot (`key_positions`), so left padding, StaticCache slots with gaps and packed 4D masks all work;
- the prompt never enters the cache: it is the same for every row, and, attending causally, only to itself, so its
  keys and values depend on the weights alone. Each forward runs it through the layers beside the inputs (one row,
  `prompt_length` tokens) and every query also attends its keys, the first `prompt_length` columns of the
  attention (a segment-pair bias, never masked). `cache_position`, masks and `max_cache_len` are the inputs' own.

Differences from upstream, on purpose:
- Upstream marks every token of each forward as context (`context = 1`) and so attends bidirectionally within a
  call (prompt included): its logits depend on how a sequence is split across calls (a full forward is not its own
  step-by-step decoding, and its prefill attends to the whole prompt). A statically shaped, chunked prefill and a
  compile-once decode cannot honour that; attention here is causal, which is upstream's own rule for tokens that
  are not context (`context = 0`, the rule of every decode step).
- Padding comes from the attention mask (upstream ignores it and takes token id 0 as padding, counting the real
  tokens as the last ones of a row); token id 0 is an ordinary token here.
- The loss shifts labels as every causal LM here does (`CausalLMMixin`); upstream's compares logits[t] with
  labels[t], so its labels must be the next tokens already.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import FULL_ATTENTION, AttentionMaskConverter, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_utils import PreTrainedModel
from .configuration_cpmant import INPUT_SEGMENT, PROMPT_TYPE, CpmAntConfig


def position_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """CPM-Ant's bidirectional T5 bucket of `relative_position` (key minus query, int): half the buckets for keys
    after the query; in each half, distances below a quarter of the buckets exactly, longer ones logarithmically up
    to `max_distance` (and the last bucket beyond)."""
    half = num_buckets // 2
    max_exact = half // 2
    buckets = (relative_position > 0).to(torch.int32) * half
    distance = relative_position.abs()
    scaled = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (scaled * (half - max_exact)).to(torch.int32)).clamp(max=half - 1)
    return buckets + torch.where(distance < max_exact, distance.to(torch.int32), large)


class CpmAntLayerNorm(nn.Module):
    """RMSNorm (variance in float32, the weight applied in the input dtype)."""

    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__()
        self.eps = config.eps
        self.weight = nn.Parameter(torch.ones(config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.float().pow(2).mean(dim=-1, keepdim=True)
        return (hidden_states * torch.rsqrt(variance + self.eps)).to(hidden_states.dtype) * self.weight


class CpmAntAttention(nn.Module):
    """Multi-head attention over the prompt's keys and the cached inputs' (`dim_head` per head, no biases); the
    score bias comes folded into the masks."""

    def __init__(self, config: CpmAntConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.dim_head
        self.scaling = self.head_dim**-0.5
        self.dropout_p = config.dropout_p or 0.0
        width = config.num_attention_heads * config.dim_head
        self.project_q = nn.Linear(config.hidden_size, width, bias=False)
        self.project_k = nn.Linear(config.hidden_size, width, bias=False)
        self.project_v = nn.Linear(config.hidden_size, width, bias=False)
        self.attention_out = nn.Linear(width, config.hidden_size, bias=False)

    def _heads(self, projection: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden_states.shape
        return projection(hidden_states).view(batch, length, -1, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        prompt_states: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs' `[batch, q_len, hidden]` and the prompt's `[1, prompt_length, hidden]` outputs.
        `attention_mask` `[batch, heads, q_len, prompt_length + kv_len]` and `prompt_mask` `[1, heads,
        prompt_length, prompt_length]` are additive, the bias included."""
        prompt_query, prompt_key, prompt_value = (
            self._heads(p, prompt_states) for p in (self.project_q, self.project_k, self.project_v)
        )  # [1, heads, prompt_length, head_dim]
        dropout = self.dropout_p
        prompt_output = attend(
            self, prompt_query, prompt_key, prompt_value, prompt_mask, scaling=self.scaling, dropout=dropout
        )
        query, key, value = (self._heads(p, hidden_states) for p in (self.project_q, self.project_k, self.project_v))
        key, value = update_kv_cache(self, key, value, cache_position=cache_position, past_key_values=past_key_values)
        batch = query.shape[0]
        key = torch.cat([prompt_key.expand(batch, -1, -1, -1), key], dim=2)  # [batch, heads, P + kv_len, head_dim]
        value = torch.cat([prompt_value.expand(batch, -1, -1, -1), value], dim=2)
        attn_output = attend(self, query, key, value, attention_mask, scaling=self.scaling, dropout=dropout)
        return self.attention_out(attn_output), self.attention_out(prompt_output)


class CpmAntSelfAttentionBlock(nn.Module):
    def __init__(self, config: CpmAntConfig, layer_idx: int) -> None:
        super().__init__()
        self.layernorm_before_attention = CpmAntLayerNorm(config)
        self.self_attention = CpmAntAttention(config, layer_idx)
        self.dropout_p = config.dropout_p or 0.0

    def forward(
        self,
        hidden_states: torch.Tensor,
        prompt_states: torch.Tensor,
        prompt_mask: torch.Tensor,
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outputs, prompt_outputs = self.self_attention(
            self.layernorm_before_attention(hidden_states),
            self.layernorm_before_attention(prompt_states),
            attention_mask=inputs.masks[FULL_ATTENTION],
            prompt_mask=prompt_mask,
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + F.dropout(outputs, p=self.dropout_p, training=self.training)
        return hidden_states, prompt_states + F.dropout(prompt_outputs, p=self.dropout_p, training=self.training)


class CpmAntDenseGatedACT(nn.Module):
    """`gelu(w_0(x)) * w_1(x)`."""

    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__()
        self.w_0 = nn.Linear(config.hidden_size, config.dim_ff, bias=False)
        self.w_1 = nn.Linear(config.hidden_size, config.dim_ff, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.w_0(hidden_states)) * self.w_1(hidden_states)


class CpmAntFeedForward(nn.Module):
    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__()
        self.w_in = CpmAntDenseGatedACT(config)
        self.dropout_p = config.dropout_p or 0.0
        self.w_out = nn.Linear(config.dim_ff, config.hidden_size, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.w_out(F.dropout(self.w_in(hidden_states), p=self.dropout_p, training=self.training))


class CpmAntFFNBlock(nn.Module):
    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__()
        self.layernorm_before_ffn = CpmAntLayerNorm(config)
        self.ffn = CpmAntFeedForward(config)
        self.dropout_p = config.dropout_p or 0.0

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        outputs = self.ffn(self.layernorm_before_ffn(hidden_states))
        return hidden_states + F.dropout(outputs, p=self.dropout_p, training=self.training)


class CpmAntTransformerBlock(nn.Module):
    """Attention then FFN, each pre-normed with a residual, applied to the inputs and to the prompt."""

    def __init__(self, config: CpmAntConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_att = CpmAntSelfAttentionBlock(config, layer_idx)
        self.ffn = CpmAntFFNBlock(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        prompt_states: torch.Tensor,
        prompt_mask: torch.Tensor,
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_states, prompt_states = self.self_att(hidden_states, prompt_states, prompt_mask, inputs)
        return self.ffn(hidden_states), self.ffn(prompt_states)


class CpmAntEncoder(nn.Module):
    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CpmAntTransformerBlock(config, i) for i in range(config.num_hidden_layers))
        self.output_layernorm = CpmAntLayerNorm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        prompt_states: torch.Tensor,
        prompt_mask: torch.Tensor,
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        for layer in self.layers:
            hidden_states, prompt_states = layer(hidden_states, prompt_states, prompt_mask, inputs)
        return self.output_layernorm(hidden_states)  # the prompt's outputs are dropped


class CpmAntSegmentPositionEmbedding(nn.Module):
    """The score bias table `[segment_types ** 2 + num_buckets, heads]`: position buckets first, then one row per
    (query segment, key segment) pair."""

    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__()
        self.num_buckets = config.position_bias_num_buckets
        self.max_distance = config.position_bias_max_distance
        self.num_segments = config.segment_types
        rows = config.segment_types * config.segment_types + config.position_bias_num_buckets
        self.relative_attention_bias = nn.Parameter(torch.zeros(rows, config.num_attention_heads))

    def forward(self, key_positions: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
        """The bias between tokens of one segment, `[batch, heads, q_len, kv_len]`, from `query_positions`
        `[batch, q_len]` and `key_positions` `[batch, kv_len]`."""
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # [batch, q_len, kv_len]
        buckets = position_bucket(relative, self.num_buckets, self.max_distance)
        return F.embedding(buckets, self.relative_attention_bias).permute(0, 3, 1, 2)

    def segment_pair(self, query_segment: int, key_segment: int) -> torch.Tensor:
        """The bias between tokens of two different segments, `[1, heads, 1, 1]`."""
        row = self.relative_attention_bias[self.num_buckets + query_segment * self.num_segments + key_segment]
        return row[None, :, None, None]


class CpmAntPreTrainedModel(PreTrainedModel):
    config_class = CpmAntConfig
    base_model_prefix = "cpmant"

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, CpmAntSegmentPositionEmbedding):
            nn.init.normal_(module.relative_attention_bias, std=self.config.init_std)


class CpmAntModel(CpmAntPreTrainedModel):
    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__(config)
        self.encoder = CpmAntEncoder(config)
        self.segment_embedding = nn.Embedding(config.segment_types, config.hidden_size)
        self.input_embedding = nn.Embedding(
            config.vocab_size + config.prompt_types * config.prompt_length, config.hidden_size
        )
        self.position_bias = CpmAntSegmentPositionEmbedding(config)
        self.prompt_length = config.prompt_length
        self.prompt_start = config.vocab_size + PROMPT_TYPE * config.prompt_length  # the prompt's first token id
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
        """Final hidden states of the inputs `[batch, q_len, hidden]` (`inputs_embeds`: rows of `input_embedding`;
        the segment embedding is added to them here)."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.input_embedding)  # [batch, q_len, hidden]
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
        dtype, device, length = inputs_embeds.dtype, inputs_embeds.device, self.prompt_length
        hidden_states = inputs_embeds + self.segment_embedding.weight[INPUT_SEGMENT]
        prompt_slots = torch.arange(length, device=device)
        prompt_ids = self.prompt_start + prompt_slots
        prompt_states = (self.input_embedding(prompt_ids) + self.segment_embedding.weight[0])[None]  # [1, P, hidden]

        # the prompt attends to itself, causally: [1, heads, P, P]
        prompt_bias = self.position_bias(prompt_slots[None], prompt_slots[None])
        causal = self.mask_converters[FULL_ATTENTION].to_4d(
            None, batch_size=1, q_len=length, kv_len=length, cache_position=prompt_slots
        )
        prompt_mask = AttentionMaskConverter.with_bias(causal, prompt_bias, dtype)
        # the inputs attend to the whole prompt (another segment), then to their keys: [batch, heads, q_len, P + kv_len]
        bias = self.position_bias(inputs.key_positions, inputs.position_ids)
        to_prompt = self.position_bias.segment_pair(INPUT_SEGMENT, 0).to(dtype)
        masks = {
            kind: torch.cat(
                [to_prompt.expand(*bias.shape[:3], length), AttentionMaskConverter.with_bias(mask, bias, dtype)], -1
            )
            for kind, mask in inputs.masks.items()
        }
        inputs = dataclasses.replace(inputs, masks=masks)
        hidden_states = self.encoder(hidden_states, prompt_states, prompt_mask, inputs)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class CpmAntForCausalLM(CausalLMMixin, CpmAntPreTrainedModel):
    """CPM-Ant with its own `vocab_size`-wide head (never tied: the input embeddings also hold the prompts')."""

    def __init__(self, config: CpmAntConfig) -> None:
        super().__init__(config)
        self.cpmant = CpmAntModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
