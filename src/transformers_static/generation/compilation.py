"""How `generate(compile=...)` compiles the decode step: with the decoder layers compiled once as a shared region
of the step's graph ("regional", compile_regions: what any compile of the forward gets), with every layer traced
inline ("full"), or inline with the weights frozen into the graph and the GEMM kernels autotuned ("max-autotune")."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from ..compile_regions import default_strategy, whole_graph
from ..linear_utils import gemm_templates

COMPILE_OPTIONS = {"fullgraph": True, "dynamic": False}
STRATEGIES = ("full", "regional", "max-autotune")
__all__ = ["COMPILE_OPTIONS", "STRATEGIES", "GuardsCheckedOnce", "compile_forward", "default_strategy"]

# "max-autotune" on CPU: the whole step with its weights as constants (inductor's freezing), so that max-autotune
# can pick, per product shape and host, between aten's GEMM and inductor's C++ GEMM template on weights packed once
# for its register-blocked kernel (SmolLM2 fp32 here: 8 rows cost 2.3x one row's step, against 3.6x through aten's
# GEMM; the first call autotunes, ~2 min).
CPU_MAX_AUTOTUNE = {
    "cpp_wrapper": True,
    "freezing": True,
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
}


# Every CPU strategy: no size and stride asserts on the graph's inputs at every call (about 20 per decoder layer in
# the Python wrapper). Dynamo's guards check the inputs' sizes and strides at each generate call's first step, and
# later steps pass the same tensors, or a fresh token of the same shape (SmolLM2: ~0.5-1.5 ms a token).
CPU_INDUCTOR = {"size_asserts": False}


def cpu_inductor_options() -> dict[str, Any]:
    """`CPU_INDUCTOR` and the vector width inductor picked for this process (`cpp.simdlen`, in bits; what it picks
    anyway). Named in the options, the width is part of inductor's FX-graph cache key, which in torch 2.13 leaves the
    ISA out: a cache directory shared between an AVX-512 and an AVX2 process (another host, `ATEN_CPU_CAPABILITY`)
    served code generated for 16 float lanes to a build of 8, and generate returned NaN logits and garbage tokens."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return {**CPU_INDUCTOR, "cpp.simdlen": pick_vec_isa().bit_width()}


def compile_forward(model: nn.Module, strategy: str, backend: str | Callable = "inductor") -> Callable[..., Any]:
    """`model.forward` compiled as one graph with `fullgraph=True, dynamic=False` (CUDA graphs through
    `mode="reduce-overhead"` / `"max-autotune"` on CUDA); "regional" compiles its decoder layers once
    (compile_regions; off the GPU), "full" traces them all (on CPU with inductor's C++ wrapper: a slower first
    call, faster steps), "max-autotune" also autotunes the products (on CPU over weights frozen at the first call:
    a copy of them is kept in the graph, and changing the model's weights afterwards raises)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown compile strategy {strategy!r}; expected True, False or one of {list(STRATEGIES)}")
    cuda = model.device.type == "cuda"
    inductor_cpu = not cuda and backend == "inductor"
    mode = ("max-autotune" if strategy == "max-autotune" else "reduce-overhead") if cuda else None
    options: dict[str, Any] = cpu_inductor_options() if inductor_cpu else {}
    if strategy == "max-autotune" and inductor_cpu:
        options.update(CPU_MAX_AUTOTUNE)
    elif strategy == "full" and inductor_cpu:
        # The whole step's graph on CPU gets inductor's C++ wrapper: the per-step Python glue between kernels goes
        # (SmolLM2 fp32: 24.3 -> 20.9 ms/token). Not for regions: torch 2.13's C++ wrapper cannot call invoke_subgraph.
        options["cpp_wrapper"] = True
    compiled = torch.compile(
        model.forward, mode=mode, backend=backend, **COMPILE_OPTIONS, **({"options": options} if options else {})
    )
    if strategy == "regional" and not cuda:
        return compiled
    freezing = bool(options.get("freezing"))
    frozen: list[FrozenWeights] = []  # the weights as the first call (the one that compiles) froze them

    def whole(*args: Any, **kwargs: Any) -> Any:
        if frozen:
            frozen[0].check()
        elif freezing:
            frozen.append(FrozenWeights(model))
        with ExitStack() as stack:
            stack.enter_context(whole_graph())
            if freezing:
                # Freezing must be on while dynamo traces too (it reads the global switch, not these options): only
                # then are the parameters marked static, with identity guards, and folded in as constants; another
                # model of this class then compiles a frozen graph of its own weights.
                stack.enter_context(torch._inductor.config.patch(freezing=True))
            if strategy == "max-autotune":
                stack.enter_context(gemm_templates())
            return compiled(*args, **kwargs)

    return whole


class FrozenWeights:
    """The model's parameters and buffers as a frozen graph captured them: `check()` (~40 us for SmolLM2's 274)
    raises where one was changed in place (its version counter moved) or replaced since (the graph would silently
    keep the old values)."""

    def __init__(self, model: nn.Module) -> None:
        # (owner's parameter or buffer dict, name, tensor, its version, qualified name)
        self.entries = [
            (table, name, tensor, tensor._version, f"{prefix}.{name}" if prefix else name)
            for prefix, module in model.named_modules()
            for table in (module._parameters, module._buffers)
            for name, tensor in table.items()
            if tensor is not None
        ]

    def check(self) -> None:
        for table, name, tensor, version, qualified in self.entries:
            if table.get(name) is not tensor or tensor._version != version:
                raise RuntimeError(
                    f"the model's weight {qualified!r} ({list(tensor.shape)}) changed after compile='max-autotune' froze "
                    "the weights into its compiled graph, which would keep computing with the old values; load the "
                    "model again (or use compile='full' / 'regional', which read the weights at every call)"
                )


class GuardsCheckedOnce:
    """A compiled forward for one generate call's one-token steps: the first call evaluates dynamo's guards in full
    (it may compile); later calls evaluate only the guards that tell the function's cached graphs apart
    (`set_stance(skip_guard_eval_unsafe=True)`). Sound here because every step of a call passes the same inputs:
    the same cache, mask buffers and position tensors, advanced in place, a fresh `[batch, 1]` token, and the same
    model, so what the full check passed at the first step still holds (SmolLM2 fp32, "full": dynamo's cache lookup
    1.25-1.4 -> 0.3 ms a step, about 0.9 ms saved net). Not for calls of other shapes (verify steps, prefill chunks),
    which could need a graph not compiled yet.

    The stance is process-wide: the steps of generate calls in other threads take turns (`_STEPS`), so no call's
    full check runs inside another's relaxed one; compiled code of one's own running in another thread meanwhile
    would skip its guards too."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward
        self.checked = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _STEPS:
            if not self.checked:
                out = self.forward(*args, **kwargs)
                self.checked = True
                return out
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self.forward(*args, **kwargs)


_STEPS = threading.RLock()  # one compiled generate step at a time in the process (see GuardsCheckedOnce)
