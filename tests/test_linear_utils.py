"""The decode kernel of linear layers: a generated reduction for one-row products under compile, F.linear otherwise.

Compiled with backend="eager" (dynamo traces the same code inductor would get, without the slow C++ build), so
what is checked is the computation chosen at trace time, against F.linear and against upstream's models.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
import transformers
from torch import nn
from torch._dynamo.testing import EagerAndRecordGraphs

from transformers_static import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers_static.linear_utils import (
    MAX_UNROLLED_FLOAT_ROWS,
    MAX_UNROLLED_ROWS,
    DecodeLinear,
    gemm_templates,
    linear,
)

from .models.causal_lm_tester import perturb

VOCAB = 80


def compiled(fn, backend="eager"):
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_reduction_equals_f_linear(batch: int, bias: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    weight, b = torch.randn(24, 40, dtype=dtype), torch.randn(24, dtype=dtype) if bias else None
    x = torch.randn(batch, 1, 40, dtype=dtype)
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    got = compiled(lambda x: linear(x, weight, b))(x)
    assert got.shape == (batch, 1, 24) and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("batch", [1, 3, MAX_UNROLLED_ROWS + 1])
def test_int8_weight_with_scale(batch: int) -> None:
    torch.manual_seed(0)
    weight = torch.randint(-127, 128, (24, 40), dtype=torch.int8)
    scale, x = torch.rand(24) / 100, torch.randn(batch, 1, 40)
    expected = F.linear(x, weight.float() * scale[:, None])
    torch.testing.assert_close(compiled(lambda x: linear(x, weight, None, scale))(x), expected)
    torch.testing.assert_close(linear(x, weight, None, scale), expected)  # eager: F.linear on the cast weight


def graph_calls(fn, x: torch.Tensor) -> set:
    """The call targets of the graph dynamo traces for `fn(x)`."""
    backend = EagerAndRecordGraphs()
    compiled(fn, backend)(x)
    (graph,) = backend.graphs
    return {node.target for node in graph.graph.nodes if node.op in ("call_function", "call_method")}


def test_decode_graph_reads_weights_in_a_reduction_and_prefill_keeps_f_linear() -> None:
    layer = DecodeLinear(40, 24)
    decode = graph_calls(layer, torch.randn(1, 1, 40))
    few_rows = graph_calls(layer, torch.randn(MAX_UNROLLED_FLOAT_ROWS, 1, 40))  # a few sequences: a reduction each
    many_rows = graph_calls(layer, torch.randn(MAX_UNROLLED_FLOAT_ROWS + 1, 1, 40))  # more: one GEMM
    prefill = graph_calls(layer, torch.randn(1, 7, 40))
    assert F.linear not in decode and "sum" in decode
    assert F.linear not in few_rows and "sum" in few_rows
    assert F.linear in many_rows and "sum" not in many_rows
    assert F.linear in prefill and "sum" not in prefill


@pytest.mark.parametrize("batch", [2, MAX_UNROLLED_FLOAT_ROWS])
def test_float_decode_rows_are_one_reduction_each(batch: int) -> None:
    """A few float rows: one [out, in] product per row (inductor reads the weight once for all of them), equal to
    F.linear."""
    torch.manual_seed(0)
    layer = DecodeLinear(40, 24)
    x = torch.randn(batch, 1, 40)
    products = traced_products(layer, x)
    assert [p for p in products if p.numel() >= 24 * 40] == [torch.Size([24, 40])] * batch
    torch.testing.assert_close(compiled(layer)(x), F.linear(x, layer.weight, layer.bias))


def traced_products(fn, x: torch.Tensor) -> list[torch.Size]:
    """The shapes of the elementwise products in the graph dynamo traces for `fn(x)`."""
    backend = EagerAndRecordGraphs()
    compiled(fn, backend)(x)
    (graph,) = backend.graphs
    return [node.meta["example_value"].shape for node in graph.graph.nodes if node.target is operator.mul]


def test_int8_decode_is_a_reduction_at_any_batch() -> None:
    weight, scale = torch.randint(-127, 128, (24, 40), dtype=torch.int8), torch.rand(24)
    for batch in (1, 3):
        calls = graph_calls(lambda x: linear(x, weight, None, scale), torch.randn(batch, 1, 40))
        assert F.linear not in calls and "sum" in calls


def test_gemm_templates_keep_products_but_an_int8_single_row() -> None:
    """Inside gemm_templates() (compile="max-autotune") float decode products and batched int8 rows stay `linear`,
    for inductor's GEMM templates; an int8 weight's single row keeps its reduction (faster than the template)."""
    layer = DecodeLinear(40, 24)
    weight, scale = torch.randint(-127, 128, (24, 40), dtype=torch.int8), torch.rand(24)
    with gemm_templates():
        float_row = graph_calls(layer, torch.randn(1, 1, 40))
        int8_row = graph_calls(lambda x: linear(x, weight, None, scale), torch.randn(1, 1, 40))
        int8_rows = graph_calls(lambda x: linear(x, weight, None, scale), torch.randn(3, 1, 40))
    assert F.linear in float_row and "sum" not in float_row
    assert F.linear not in int8_row and "sum" in int8_row
    assert F.linear in int8_rows and "sum" not in int8_rows


@pytest.mark.parametrize("batch", [2, MAX_UNROLLED_ROWS])
def test_int8_decode_rows_are_one_reduction_each(batch: int) -> None:
    """Several rows: one [out, in] product per row (fused into one pass over the weight), never a broadcast
    [rows, out, in] product (which inductor turns into a pass over the weight per row)."""
    weight, scale = torch.randint(-127, 128, (24, 40), dtype=torch.int8), torch.rand(24)
    products = traced_products(lambda x: linear(x, weight, None, scale), torch.randn(batch, 1, 40))
    assert [p for p in products if p.numel() >= 24 * 40] == [torch.Size([24, 40])] * batch


@pytest.mark.parametrize("batch", [1, 2])
def test_eager_is_f_linear_exactly(batch: int) -> None:
    """Outside compile nothing changes: the same aten call, bit for bit (a reduction would round differently)."""
    torch.manual_seed(0)
    layer = DecodeLinear(256, 24)
    x = torch.randn(batch, 1, 256)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_models_get_decode_linears_with_their_state_dict_unchanged() -> None:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2
    )
    upstream = transformers.LlamaForCausalLM(config)
    model = LlamaForCausalLM(LlamaConfig(**config.to_dict()))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is DecodeLinear for m in linears)
    assert model.state_dict().keys() == upstream.state_dict().keys()


UPSTREAM_MODELS = {
    "llama-tied": (transformers.LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen2-qkv-bias": (transformers.Qwen2Config, dict(num_key_value_heads=2)),
    "phi-head-bias": (transformers.PhiConfig, dict()),
}


@pytest.fixture(scope="module", params=sorted(UPSTREAM_MODELS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    config_class, extra = UPSTREAM_MODELS[request.param]
    torch.manual_seed(0)
    config = config_class(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, **extra
    )
    upstream = perturb(transformers.AutoModelForCausalLM.from_config(config).eval(), 0.1)  # biases, norms matter
    path = tmp_path_factory.mktemp(request.param)
    upstream.save_pretrained(path)
    return upstream, AutoModelForCausalLM.from_pretrained(path)


@pytest.mark.parametrize("batch", [1, 2])
def test_compiled_decode_step_logits_match_eager(pair, batch: int) -> None:
    """One decode step through the compiled forward (reductions) against eager (F.linear), on a static cache."""
    _, model = pair
    ids = torch.randint(3, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(batch))
    eager = model.generate(ids, max_new_tokens=4, eos_token_id=None, return_dict_in_generate=True, output_logits=True)
    forward = model.forward
    model.forward = compiled(forward)
    try:
        out = model.generate(
            ids, max_new_tokens=4, eos_token_id=None, return_dict_in_generate=True, output_logits=True
        )
    finally:
        model.forward = forward
        torch._dynamo.reset()
    assert torch.equal(out.sequences, eager.sequences)
    for got, want in zip(out.logits, eager.logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_compiled_tokens_equal_upstreams(pair) -> None:
    upstream, model = pair
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(5))
    expected = upstream.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    forward = model.forward
    model.forward = compiled(forward)
    try:
        got = model.generate(ids, max_new_tokens=10, eos_token_id=None)
    finally:
        model.forward = forward
        torch._dynamo.reset()
    assert torch.equal(got, expected)
