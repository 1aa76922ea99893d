"""The int8 decode kernel that inductor generates is vectorised on this host's ISA (issue 27): a scalar int8
reduction is several times slower than the float32 path, so it must not come back silently."""

from __future__ import annotations

import pytest
import torch
from torch._inductor import cpu_vec_isa
from torch._inductor.utils import fresh_cache, run_and_get_code

from transformers_static.quantization import Int8Linear


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
