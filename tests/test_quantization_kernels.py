"""The int8 decode kernels (issue 27). With 512-bit vectors, the reduction inductor generates is vectorised on this
host's ISA: a scalar int8 reduction is several times slower than the float32 path, so it must not come back
silently. With narrower vectors (AVX2), where inductor's int8 loads are slow, the products go to aten's int8 kernel
on bfloat16 activations; those tests force that choice, so they run on every host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
import transformers
from torch._dynamo.testing import EagerAndRecordGraphs
from torch._inductor import config as inductor_config
from torch._inductor import cpu_vec_isa
from torch._inductor.utils import fresh_cache, run_and_get_code

from transformers_static import AutoModelForCausalLM, linear_utils
from transformers_static.generation.compilation import compile_forward
from transformers_static.linear_utils import linear, narrow_cpu_vectors  # the real one: conftest pins a stand-in
from transformers_static.quantization import Int8Linear

INT8PACK = torch.ops.aten._weight_int8pack_mm.default


@pytest.fixture
def narrow_vectors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As on an AVX2 host (the tests' conftest pins 512 bits)."""
    monkeypatch.setattr(linear_utils, "narrow_cpu_vectors", lambda: True)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def int8pack_calls(graph: torch.fx.GraphModule) -> int:
    """Calls of aten's int8 kernel in a traced graph and in the subgraphs it calls (regions)."""
    return sum(
        node.target in (INT8PACK, torch._weight_int8pack_mm)
        for module in graph.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    )


@pytest.mark.parametrize(
    ("host", "capability", "narrow"),
    [
        ((cpu_vec_isa.VecAMX, cpu_vec_isa.VecAVX512, cpu_vec_isa.VecAVX2), None, False),
        ((cpu_vec_isa.VecAVX512, cpu_vec_isa.VecAVX2), None, False),
        ((cpu_vec_isa.VecAVX512, cpu_vec_isa.VecAVX2), "avx2", True),
        ((cpu_vec_isa.VecAVX2,), None, True),
    ],
    ids=["amx", "avx512", "avx512-capability-avx2", "avx2"],
)
def test_narrow_vectors_are_what_inductor_picks_under_512_bits(
    monkeypatch: pytest.MonkeyPatch, host: tuple[type[cpu_vec_isa.VecISA], ...], capability: str | None, narrow: bool
) -> None:
    """The choice follows the vector width inductor picks from the host's ISAs (faked here, so every host checks every
    case) and `ATEN_CPU_CAPABILITY`, which narrows it as an AVX2 host would."""
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: [isa() for isa in host])
    if capability is None:
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    with inductor_config.patch({"cpp.simdlen": None}):  # no width forced: the host's ISAs and the variable decide
        assert narrow_cpu_vectors() is narrow


def test_narrow_vectors_follow_this_hosts_capability_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the real host: `ATEN_CPU_CAPABILITY=avx2` gives inductor 256-bit vectors, and so the narrow choice."""
    if not any(isa.bit_width() >= 256 for isa in cpu_vec_isa.valid_vec_isa_list()):
        pytest.skip("this CPU has no AVX2 (or wider) vectors for inductor")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert cpu_vec_isa.pick_vec_isa().bit_width() == 256 and narrow_cpu_vectors()


@pytest.mark.parametrize("rows", [1, 3])
def test_narrow_vectors_send_int8_decode_rows_to_aten_int8_kernel(narrow_vectors: None, rows: int) -> None:
    """One aten call per product, no reduction; the result is the dequantised product up to bfloat16 rounding (the
    scale and bias applied after it, in float32); eager keeps F.linear."""
    torch.manual_seed(0)
    weight, scale, bias = torch.randint(-127, 128, (24, 48), dtype=torch.int8), torch.rand(24) / 100, torch.randn(24)
    x = torch.randn(rows, 1, 48)
    expected = torch.nn.functional.linear(x, weight.float() * scale[:, None], bias)
    backend = EagerAndRecordGraphs()
    got = torch.compile(lambda x: linear(x, weight, bias, scale), backend=backend, fullgraph=True)(x)
    (graph,) = backend.graphs
    targets = [node.target for node in graph.graph.nodes]
    assert int8pack_calls(graph) == 1 and "sum" not in targets
    assert got.shape == expected.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert torch.equal(linear(x, weight, bias, scale), torch.nn.functional.linear(x, weight.float()) * scale + bias)


def test_narrow_vectors_keep_the_reduction_for_widths_aten_int8_kernel_gets_wrong(narrow_vectors: None) -> None:
    """40 inputs (8 mod 16): aten's AVX-512 int8 kernel returns garbage there, so the product stays a reduction."""
    torch.manual_seed(0)
    weight, scale = torch.randint(-127, 128, (24, 40), dtype=torch.int8), torch.rand(24) / 100
    x = torch.randn(1, 1, 40)
    backend = EagerAndRecordGraphs()
    got = torch.compile(lambda x: linear(x, weight, None, scale), backend=backend, fullgraph=True)(x)
    (graph,) = backend.graphs
    assert int8pack_calls(graph) == 0 and "sum" in [node.target for node in graph.graph.nodes]
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight.float() * scale[:, None]))


def test_narrow_vectors_int8_kernel_compiles_with_inductor(narrow_vectors: None) -> None:
    """inductor lowers aten's int8 kernel with our unit scales (a slice of a graph input: a scale computed in the
    graph makes torch 2.13's lowering assert) and computes what the traced graph computes."""
    torch.manual_seed(0)
    layer = Int8Linear.from_weight(torch.randn(32, 64), torch.randn(32))
    x = torch.randn(1, 1, 64)
    eager_graph = torch.compile(layer, backend="eager", fullgraph=True, dynamic=False)(x)
    torch._dynamo.reset()
    with fresh_cache():
        out, (code, *_) = run_and_get_code(torch.compile(layer, backend="inductor", fullgraph=True, dynamic=False), x)
    assert "_weight_int8pack_mm" in code
    torch.testing.assert_close(out, eager_graph, rtol=1e-5, atol=1e-5)


def test_narrow_vectors_regional_decode_step_uses_aten_int8_kernel(narrow_vectors: None, tmp_path: Path) -> None:
    """generate's regional compile of an int8 Llama: every decode product (7 a layer in the shared region, and the
    head) goes to aten's kernel; one graph for the first call, none for the next; on this tiny model the tokens are
    the eager int8 model's."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization="int8")
    ids = torch.tensor([[5, 9, 13, 17]])
    eager = model.generate(ids, max_new_tokens=6, eos_token_id=None)
    backend = EagerAndRecordGraphs()
    model._compiled_forwards = {"regional": compile_forward(model, "regional", backend=backend)}
    compiled = [model.generate(ids, max_new_tokens=6, eos_token_id=None, compile="regional") for _ in range(2)]
    (graph,) = backend.graphs  # the decode step (prefill chunks are not compiled), once
    assert int8pack_calls(graph) == 7 + 1
    assert compiled[0].tolist() == compiled[1].tolist() == eager.tolist()


def test_compiled_int8_one_row_product_is_vectorised() -> None:
    isa = cpu_vec_isa.pick_vec_isa()
    if not isa:
        pytest.skip("inductor finds no vector ISA on this CPU: its int8 reduction is scalar here")
    torch.manual_seed(0)
    layer = Int8Linear.from_weight(torch.randn(32, 64), torch.randn(32))
    x = torch.randn(1, 1, 64)  # [batch, q_len, in]: one decode row
    with fresh_cache():  # generated for this host's ISA, not read from another's cache entry
        compiled = torch.compile(layer, backend="inductor", fullgraph=True, dynamic=False)
        out, (code, *_) = run_and_get_code(compiled, x)
    torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-5)
    # the int8 weight is loaded as a vector and converted to float32 lanes of this ISA's width, inside the reduction
    assert "at::vec::Vectorized<int8_t>::loadu" in code, f"int8 reduction not vectorised for {isa}:\n{code}"
    assert "at::vec::convert<float>" in code
    assert f"static_cast<int64_t>({isa.nelements()}L))" in code  # the reduction loop steps one vector per iteration
