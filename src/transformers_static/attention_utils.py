"""Attention kernels behind one registry and one signature.

    fn(module, query, key, value, attention_mask, scaling, dropout, softcap, sinks)
        -> (attn_output, attn_weights | None)

query `[batch, heads, q_len, head_dim]`, key/value `[batch, kv_heads, kv_len, head_dim]` (the value's head_dim may
differ: latent attention's value is a slice of its key), attention_mask `[batch, 1, q_len, kv_len]` (bool, True =
attend, or additive float) made by AttentionMaskConverter. attn_output is `[batch, q_len, heads, value head_dim]`. Grouped key/value heads are shared by grouping the queries (no
copy of the cache per step). `softcap`
(Gemma2) squashes scores to `tanh(s / cap) * cap` before the mask; `sinks` `[heads]` (gpt-oss) adds one learned
logit per head to each query's softmax, a column dropped after it (mass that goes to no value). Only the eager
kernel can do either.

Under compile, one query per sequence on CPU (a decode step), both kernels become `decode_attention`: generated
reductions over the cache, in float32, which inductor fuses with the mask and the softmax (SmolLM2: torch's CPU SDPA
costs 50-90 us a call at decode sizes, 30 calls a token).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .cache_utils import Cache, StaticLayerCache

AttentionFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """`tanh(x / cap) * cap`: squashes `x` smoothly into (-cap, cap), in `x`'s dtype (Gemma2's scores and logits)."""
    return torch.tanh(x / cap) * cap


def group_queries(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """`[batch, heads, q_len, head_dim]` -> `[batch, kv_heads, n_rep * q_len, head_dim]`: the queries sharing a
    key/value head become rows of one product, so grouped keys/values are read in place, never repeated."""
    batch, heads, q_len, head_dim = query.shape
    return query.reshape(batch, kv_heads, heads // kv_heads * q_len, head_dim)


def group_mask(attention_mask: torch.Tensor | None, kv_heads: int, n_rep: int) -> torch.Tensor | None:
    """The mask for grouped queries: `[batch, 1 | heads, q_len, kv_len]` -> `[batch, 1 | kv_heads, n_rep * q_len,
    kv_len]` (rows ordered as `group_queries` orders them: query head major, then query). None, or one query head
    per key/value head, passes through."""
    if attention_mask is None or n_rep == 1:
        return attention_mask
    batch, mask_heads, q_len, kv_len = attention_mask.shape
    if mask_heads == 1:
        return attention_mask.repeat(1, 1, n_rep, 1)
    return attention_mask.reshape(batch, kv_heads, n_rep * q_len, kv_len)


def masked_scores(
    scores: torch.Tensor, attention_mask: torch.Tensor | None, softcap: float | None = None
) -> torch.Tensor:
    """Soft-capped in `scores`' dtype (as upstream), then float32 and masked: a bool mask puts float32's lowest where
    it is False, an additive one is added and clamped there (fp16/bf16-safe: no -inf, no NaN rows). `scores` and the
    (grouped) mask broadcast: `[batch, kv_heads, rows, kv_len]`."""
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    scores = scores.float()
    if attention_mask is not None:
        lowest = torch.finfo(torch.float32).min
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, lowest)
        else:
            scores = (scores + attention_mask.float()).clamp(min=lowest)
    return scores


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None, q_len: int) -> torch.Tensor:
    """Softmax over the keys of grouped scores `[batch, kv_heads, n_rep * q_len, kv_len]`; with `sinks` `[heads]`,
    each row's head's sink joins its softmax as one more column, dropped after (mass that goes to no value)."""
    if sinks is None:
        return F.softmax(scores, dim=-1)
    batch, kv_heads = scores.shape[:2]
    sink = sinks.float().reshape(1, kv_heads, -1, 1, 1).expand(batch, -1, -1, q_len, 1)  # rows as group_queries
    return F.softmax(torch.cat([scores, sink.reshape(batch, kv_heads, -1, 1)], dim=-1), dim=-1)[..., :-1]


def use_decode_attention(module: nn.Module, query: torch.Tensor, dropout: float) -> bool:
    """Whether attention is written as reductions (`decode_attention`): while compiling, one query per sequence
    (`query` `[batch, heads, 1, head_dim]`), on CPU, no dropout. Static facts at trace time."""
    return (
        torch.compiler.is_compiling()
        and query.shape[2] == 1
        and query.device.type == "cpu"
        and not (dropout and module.training)
    )


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query per sequence against the whole cache, as elementwise products and sums that inductor fuses into a
    pass over the keys, the softmax and a pass over the values; all in float32. Same semantics as `eager_attention`
    (soft-capped scores, mask, `sinks`; a query with no key to attend to spreads its weight evenly), returning
    `([batch, 1, heads, head_dim], weights [batch, heads, 1, kv_len])`, both in `query`'s dtype."""
    batch, heads, _, head_dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    n_rep = heads // kv_heads
    grouped = query.float().reshape(batch, kv_heads, n_rep, 1, head_dim)  # one key/value head's queries together
    scores = (grouped * key.float()[:, :, None]).sum(-1) * scaling  # [batch, kv_heads, n_rep, kv_len]
    scores = masked_scores(scores, group_mask(attention_mask, kv_heads, n_rep), softcap)
    weights = softmax_with_sinks(scores, sinks, q_len=1)  # [batch, kv_heads, n_rep, kv_len]
    attn_output = (weights[..., None] * value.float()[:, :, None]).sum(-2)  # [batch, kv_heads, n_rep, head_dim]
    attn_output = attn_output.reshape(batch, 1, heads, value.shape[-1]).to(query.dtype)
    return attn_output, weights.reshape(batch, heads, 1, kv_len).to(query.dtype)


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores in the model dtype (soft-capped there, as upstream), masked and softmaxed in float32, with the
    `sinks` column when given."""
    if use_decode_attention(module, query, dropout):
        return decode_attention(query, key, value, attention_mask, scaling, softcap, sinks)
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    grouped = group_queries(query, kv_heads)  # [batch, kv_heads, n_rep * q_len, head_dim]
    scores = torch.matmul(grouped, key.transpose(2, 3)) * scaling  # [batch, kv_heads, n_rep * q_len, kv_len]
    scores = masked_scores(scores, group_mask(attention_mask, kv_heads, heads // kv_heads), softcap)
    weights = softmax_with_sinks(scores, sinks, q_len).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    attn_output = torch.matmul(weights, value).reshape(batch, heads, q_len, value.shape[-1])
    return attn_output.transpose(1, 2).contiguous(), weights.reshape(batch, heads, q_len, -1)


def sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:
    """torch's scaled_dot_product_attention with the explicit mask (never `is_causal`: one graph for all shapes).

    A query row with no key to attend to (a left-padding position) comes out as zeros, not NaN."""
    if softcap is not None:
        raise ValueError("sdpa cannot soft-cap attention scores: use attn_implementation='eager'")
    if sinks is not None:
        raise ValueError("sdpa cannot add attention sinks to the softmax: use attn_implementation='eager'")
    if use_decode_attention(module, query, dropout):
        return decode_attention(query, key, value, attention_mask, scaling)[0], None
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.to(query.dtype)
    attention_mask = group_mask(attention_mask, kv_heads, heads // kv_heads)
    attn_output = F.scaled_dot_product_attention(
        group_queries(query, kv_heads),
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
    )  # [batch, kv_heads, n_rep * q_len, head_dim]
    return attn_output.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous(), None


ATTENTION_FUNCTIONS: dict[str, AttentionFn] = {"eager": eager_attention, "sdpa": sdpa_attention}


def get_attention_function(name: str) -> AttentionFn:
    if name not in ATTENTION_FUNCTIONS:
        raise ValueError(f"Unknown attn_implementation {name!r}; expected one of {sorted(ATTENTION_FUNCTIONS)}")
    return ATTENTION_FUNCTIONS[name]


def update_kv_cache(
    module: nn.Module,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    cache_position: torch.Tensor,
    past_key_values: Cache | StaticLayerCache | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Store the new key/value `[batch, kv_heads, q_len, head_dim]` at `cache_position` in `module.layer_idx`'s slot
    (or in `past_key_values` itself when it is already that slot) and return every key/value the mask covers,
    `[batch, kv_heads, kv_len, head_dim]`; without a cache, the new ones. Layers that reuse another layer's
    keys/values (Gemma 4's shared layers) keep what their source got here."""
    if isinstance(past_key_values, StaticLayerCache):  # this layer's own slot (regional compilation): no index
        return past_key_values.update_layer(key, value, cache_position)
    if past_key_values is not None:
        return past_key_values.update(key, value, module.layer_idx, cache_position)
    return key, value


def attend(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the kernel of `module.config._attn_implementation` (`dropout` only while training) over keys/values
    already in the cache and merge the heads: `[batch, q_len, heads * head_dim]`, ready for the output projection."""
    attention = get_attention_function(module.config._attn_implementation)
    attn_output, _ = attention(
        module,
        query,
        key,
        value,
        attention_mask,
        scaling=scaling,
        dropout=dropout if module.training else 0.0,
        softcap=softcap,
        sinks=sinks,
    )  # [batch, q_len, heads, head_dim]
    batch, q_len = attn_output.shape[:2]
    return attn_output.reshape(batch, q_len, -1)


def attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    cache_position: torch.Tensor,
    past_key_values: Cache | StaticLayerCache | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The tail every attention module shares: store the new key/value at `cache_position` (before attending, so
    the query sees its own key), then `attend`.

    `module` has `layer_idx` (its cache slot, unless `past_key_values` is already that slot) and `config`; query is
    `[batch, heads, q_len, head_dim]`, key/value `[batch, kv_heads, q_len, head_dim]`."""
    key, value = update_kv_cache(module, key, value, cache_position=cache_position, past_key_values=past_key_values)
    return attend(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, softcap=softcap, sinks=sinks
    )
