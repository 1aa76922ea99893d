"""Every test sees the same decode kernels on every host: int8 decode products are the generated reductions, as on
CPUs with 512-bit vectors, also where inductor's vectors are narrower (AVX2), which would otherwise send them to
aten's int8 kernel on bfloat16 activations (`linear_utils.use_int8pack`) and round differently from the eager int8
model the tests compare with. tests/test_quantization_kernels.py checks that path itself, on every host."""

from __future__ import annotations

import pytest

from transformers_static import linear_utils


@pytest.fixture(autouse=True)
def vectors_of_512_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_utils, "narrow_cpu_vectors", lambda: False)
