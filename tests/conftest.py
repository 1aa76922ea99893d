"""Every test sees the same decode kernels on every host: int8 decode products are the generated reductions, as on
CPUs with 512-bit vectors, also where inductor's vectors are narrower (AVX2), which would otherwise send them to
aten's int8 kernel on bfloat16 activations (`linear_utils.use_int8pack`) and round differently from the eager int8
model the tests compare with. tests/test_quantization_kernels.py checks that path itself, on every host.

The run's inductor cache is a directory of the run's vector ISA, unless the caller chose one: torch 2.13's FX-graph
cache key leaves the ISA out (generation/compilation.cpu_inductor_options names it for the library's compiles, but
tests also compile plain functions), so runs under two ISAs on one machine (an AVX2 host's CI after an AVX-512 one's,
`ATEN_CPU_CAPABILITY=avx2`) would otherwise be served each other's code."""

from __future__ import annotations

import os
import re

CACHE_CHOSEN = "TORCHINDUCTOR_CACHE_DIR" in os.environ  # before torch._inductor's import sets it to its default

import pytest  # noqa: E402
from torch._inductor.cpu_vec_isa import pick_vec_isa  # noqa: E402
from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # noqa: E402

from transformers_static import linear_utils  # noqa: E402

if not CACHE_CHOSEN:  # read by inductor at each compile, and by the tests' subprocesses
    isa = re.sub(r"\W+", "-", str(pick_vec_isa()) or "scalar")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default_cache_dir(), f"tests-{isa}")


@pytest.fixture(autouse=True)
def vectors_of_512_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_utils, "narrow_cpu_vectors", lambda: False)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist the workers share the host's cores: each gets its share of torch's intra-op threads, so two
    workers on two cores do not oversubscribe them (tiny models' kernels spin-wait badly when they do)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
