"""Attention kernels behind one registry and one signature.

    fn(module, query, key, value, attention_mask, scaling, dropout, softcap) -> (attn_output, attn_weights | None)

query `[batch, heads, q_len, head_dim]`, key/value `[batch, kv_heads, kv_len, head_dim]`, attention_mask
`[batch, 1, q_len, kv_len]` (bool, True = attend, or additive float) made by AttentionMaskConverter.
attn_output is `[batch, q_len, heads, head_dim]`. Grouped key/value heads are repeated here, once. `softcap`
(Gemma2) squashes scores to `tanh(s / cap) * cap` before the mask; only the eager kernel can do it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

AttentionFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """`[batch, kv_heads, kv_len, head_dim]` -> `[batch, kv_heads * n_rep, kv_len, head_dim]`."""
    if n_rep == 1:
        return hidden_states
    batch, kv_heads, kv_len, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None].expand(batch, kv_heads, n_rep, kv_len, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, kv_len, head_dim)


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores in the model dtype (soft-capped there, as upstream), masked and softmaxed in float32
    (fp16/bf16-safe: no -inf, no NaN rows)."""
    n_rep = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [batch, heads, q_len, kv_len]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.float()
    if attention_mask is not None:
        lowest = torch.finfo(torch.float32).min
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, lowest)
        else:
            scores = (scores + attention_mask.float()).clamp(min=lowest)
    weights = F.softmax(scores, dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    attn_output = torch.matmul(weights, value)  # [batch, heads, q_len, head_dim]
    return attn_output.transpose(1, 2).contiguous(), weights


def sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, None]:
    """torch's scaled_dot_product_attention with the explicit mask (never `is_causal`: one graph for all shapes).

    A query row with no key to attend to (a left-padding position) comes out as zeros, not NaN."""
    if softcap is not None:
        raise ValueError("sdpa cannot soft-cap attention scores: use attn_implementation='eager'")
    n_rep = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.to(query.dtype)
    attn_output = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
    )
    return attn_output.transpose(1, 2).contiguous(), None


ATTENTION_FUNCTIONS: dict[str, AttentionFn] = {"eager": eager_attention, "sdpa": sdpa_attention}


def get_attention_function(name: str) -> AttentionFn:
    if name not in ATTENTION_FUNCTIONS:
        raise ValueError(f"Unknown attn_implementation {name!r}; expected one of {sorted(ATTENTION_FUNCTIONS)}")
    return ATTENTION_FUNCTIONS[name]
