"""Decode attention under compile: one query per sequence on CPU runs as generated reductions (`decode_attention`),
with the semantics of the eager kernel (grouped heads, bool or additive masks, per-head masks, soft-capping, sinks).

Compiled with backend="eager": dynamo traces what inductor would get; the references are the same kernel outside
compile (matmuls, or torch's SDPA) and `reference_attention`, written out per head in float64 (keys/values repeated
per query head, the mask expanded per head), which shares no helper with the kernels.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.testing import EagerAndRecordGraphs

from transformers_static.attention_utils import eager_attention, sdpa_attention

MODULE = torch.nn.Module().eval()


def compiled(fn, backend="eager"):
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)


def inputs(batch: int, heads: int, kv_heads: int, kv_len: int, dtype: torch.dtype, q_len: int = 1):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(batch, heads, q_len, 16, generator=generator).to(dtype)
    key, value = (torch.randn(batch, kv_heads, kv_len, 16, generator=generator).to(dtype) for _ in range(2))
    return query, key, value


def decode_mask(batch: int, heads: int, kv_len: int, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1 | heads, 1, kv_len]: each row sees a different prefix (a per-head mask: each head its own)."""
    seen = torch.arange(kv_len) < torch.arange(1, batch * heads + 1).reshape(batch, heads, 1, 1) * 2 + 1
    mask = seen if kind == "per_head" else seen[:, :1]
    if kind == "additive":
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def reference_attention(query, key, value, mask, scaling, softcap=None, sinks=None) -> torch.Tensor:
    """`[batch, q_len, heads, head_dim]`, per head in float64; a False or `finfo.min` mask entry drops the key."""
    heads, kv_heads = query.shape[1], key.shape[1]
    key, value = (t.double().repeat_interleave(heads // kv_heads, dim=1) for t in (key, value))
    scores = query.double() @ key.transpose(2, 3) * scaling  # [batch, heads, q_len, kv_len]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    keep = mask if mask.dtype == torch.bool else mask == 0
    scores = scores.masked_fill(~keep.expand(scores.shape), float("-inf"))
    if sinks is not None:
        sink = sinks.double().reshape(1, heads, 1, 1).expand(*scores.shape[:3], 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return (weights @ value).transpose(1, 2).to(query.dtype)


def reference_mask(batch: int, heads: int, q_len: int, kv_len: int, kind: str) -> torch.Tensor:
    """[batch, 1 | heads, q_len, kv_len]: every (sequence, head, query) row sees its own prefix, at least one key."""
    rows = torch.arange(batch * heads * q_len).reshape(batch, heads, q_len, 1)
    seen = torch.arange(kv_len) < rows * 3 % kv_len + 1
    mask = seen if kind == "per_head" else seen[:, :1]
    if kind == "additive":
        return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    return mask


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("kind", ["bool", "additive", "per_head"])
@pytest.mark.parametrize("attention", [eager_attention, sdpa_attention])
@pytest.mark.parametrize("q_len", [1, 3])
def test_kernels_equal_a_plain_reference(q_len: int, attention, kind: str, heads: int, kv_heads: int) -> None:
    """One query per sequence compiled (`decode_attention`), several outside compile (the kernel's own products)."""
    query, key, value = inputs(2, heads, kv_heads, 10, torch.float32, q_len=q_len)
    mask = reference_mask(2, heads, q_len, 10, kind)
    run = lambda q: attention(MODULE, q, key, value, mask, scaling=0.3)[0]  # noqa: E731
    got = (compiled(run) if q_len == 1 else run)(query)
    torch.testing.assert_close(got, reference_attention(query, key, value, mask, 0.3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("softcap,with_sinks", [(5.0, False), (None, True), (5.0, True)])
@pytest.mark.parametrize("q_len", [1, 3])
def test_eager_soft_caps_and_sinks_as_a_plain_reference(q_len: int, softcap: float | None, with_sinks: bool) -> None:
    query, key, value = inputs(2, 6, 2, 9, torch.float32, q_len=q_len)
    query = query * 10  # scores past the cap
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.5]) if with_sinks else None
    mask = reference_mask(2, 6, q_len, 9, "per_head")
    kwargs = dict(scaling=0.3, softcap=softcap, sinks=sinks)
    run = lambda q: eager_attention(MODULE, q, key, value, mask, **kwargs)[0]  # noqa: E731
    got = (compiled(run) if q_len == 1 else run)(query)
    torch.testing.assert_close(got, reference_attention(query, key, value, mask, **kwargs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("kind", ["bool", "additive", "per_head"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_equals_eager(heads: int, kv_heads: int, kind: str, dtype: torch.dtype) -> None:
    query, key, value = inputs(2, heads, kv_heads, 11, dtype)
    mask = decode_mask(2, heads, 11, kind, dtype)
    expected, expected_weights = eager_attention(MODULE, query, key, value, mask, scaling=0.3)
    got, weights = compiled(lambda q: eager_attention(MODULE, q, key, value, mask, scaling=0.3))(query)
    assert got.shape == (2, 1, heads, 16) and got.dtype == dtype and weights.shape == (2, heads, 1, 11)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(weights, expected_weights, rtol=tolerance, atol=tolerance)
    assert (weights[0, 0, 0, 3:] == 0).all()  # the first row sees three keys


def test_compiled_sdpa_decode_equals_torch_sdpa() -> None:
    query, key, value = inputs(3, 6, 2, 13, torch.float32)
    mask = decode_mask(3, 6, 13, "bool", torch.float32)
    expected, _ = sdpa_attention(MODULE, query, key, value, mask, scaling=0.25)
    got, weights = compiled(lambda q: sdpa_attention(MODULE, q, key, value, mask, scaling=0.25))(query)
    assert weights is None
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def graph_calls(fn, query: torch.Tensor) -> set:
    backend = EagerAndRecordGraphs()
    compiled(fn, backend)(query)
    (graph,) = backend.graphs
    return {node.target for node in graph.graph.nodes if node.op in ("call_function", "call_method")}


@pytest.mark.parametrize("attention", [eager_attention, sdpa_attention])
def test_only_a_compiled_decode_step_on_cpu_is_written_as_reductions(attention) -> None:
    """One query per sequence: sums, no SDPA or matmul; a prefill (several queries) keeps the kernel's own call."""
    calls = {}
    for q_len in (1, 4):
        query, key, value = inputs(2, 6, 2, 8, torch.float32, q_len=q_len)
        mask = torch.ones(2, 1, q_len, 8, dtype=torch.bool)
        calls[q_len] = graph_calls(lambda q: attention(MODULE, q, key, value, mask, scaling=0.3), query)  # noqa: B023
    products = {F.scaled_dot_product_attention, torch.matmul}
    assert "sum" in calls[1] and not products & calls[1]
    assert products & calls[4] and "sum" not in calls[4]
