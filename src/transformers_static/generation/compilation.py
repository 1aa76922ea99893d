"""How `generate(compile=...)` compiles the decode step: with the decoder layers compiled once as a shared region
of the step's graph ("regional", compile_regions: what any compile of the forward gets), or with every layer traced
inline ("full")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..compile_regions import default_strategy, whole_graph

COMPILE_OPTIONS = {"fullgraph": True, "dynamic": False}
STRATEGIES = ("full", "regional")
__all__ = ["COMPILE_OPTIONS", "STRATEGIES", "compile_forward", "default_strategy"]


def compile_forward(model: nn.Module, strategy: str, backend: str | Callable = "inductor") -> Callable[..., Any]:
    """`model.forward` compiled as one graph with `fullgraph=True, dynamic=False` (CUDA graphs through
    `mode="reduce-overhead"` on CUDA); "regional" compiles its decoder layers once (compile_regions; off the GPU),
    "full" traces them all (on CPU with inductor's C++ wrapper: a slower first call, faster steps)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown compile strategy {strategy!r}; expected True, False or one of {list(STRATEGIES)}")
    cuda = model.device.type == "cuda"
    mode = "reduce-overhead" if cuda else None
    # The whole step's graph on CPU gets inductor's C++ wrapper: the per-step Python glue between kernels goes
    # (SmolLM2 fp32: 24.3 -> 20.9 ms/token). Not for regions: torch 2.13's C++ wrapper cannot call invoke_subgraph.
    cpp_wrapper = strategy == "full" and not cuda and backend == "inductor"
    options = {"options": {"cpp_wrapper": True}} if cpp_wrapper else {}
    compiled = torch.compile(model.forward, mode=mode, backend=backend, **COMPILE_OPTIONS, **options)
    if strategy == "regional" and not cuda:
        return compiled

    def whole(*args: Any, **kwargs: Any) -> Any:
        with whole_graph():
            return compiled(*args, **kwargs)

    return whole
