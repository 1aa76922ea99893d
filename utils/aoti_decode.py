"""The packaged (AOTInductor) decode step, measured against generate's regional one.

    python utils/aoti_decode.py MODEL_DIR [--quantization int8|int4] [--dtype float32] [--tokens 64]
                                [--variants plain stack stack-small-kernels]

A prototype outside generate, for docs/BENCHMARK.md (issue 27, item 4). After generate's own prefill, one greedy
decode step (generate's `_decode_one_token`, then argmax) is exported with `torch.export` (non-strict, every
decoder layer inline) and compiled ahead of time with `torch._inductor.aoti_compile_and_package`: the step's Python
wrapper and dynamo's per-call work become one C++ call. The weights are not copied into the package: the loaded
step reads the model's own tensors (`load_constants(..., user_managed=True)`), and the cache, mask and positions are
its inputs, written in place. Variants: "plain" (inductor's defaults), "stack" (`aot_inductor.allow_stack_allocation`:
the step's intermediates on the C++ stack instead of one allocation each), "stack-small-kernels" (also at most 48
arguments per generated C++ function, about one decoder layer, where inductor's limit of 500 makes three functions
of the whole step). Prints, per variant and for the regional
step of `generate(compile=True)` in the same process (alternated runs): the first call (export, compile and load;
the regional step's from inductor's cache), ms a token, the profiled time a token spends in generated kernels, the
time outside them (a profiled run's wall clock less the kernels, which counts the profiler's own cost per event,
and an unprofiled run's), medians of 5 runs each, and whether the tokens equal `generate(compile=True)`'s greedy
tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
import torch._inductor.config
from multistep_decode import KERNELS, decode, steps_function
from profile_decode import group_of
from torch import nn
from torch._inductor.codegen.cpp import CppScheduling
from torch.profiler import ProfilerActivity, profile

from transformers_static import AutoModelForCausalLM
from transformers_static.compile_regions import whole_graph
from transformers_static.generation.compilation import cpu_inductor_options
from transformers_static.modeling_inputs import inputs_checked

STACK = {"aot_inductor.allow_stack_allocation": True}
# variant: (inductor options, the most arguments of one generated C++ function; inductor's default is 500)
VARIANTS = {
    "plain": ({}, None),
    "stack": (STACK, None),
    "stack-small-kernels": ({**STACK, "fx_graph_cache": False}, 48),
}  # not from the cache: the limit is not in its key

Slot = tuple[Any, Any]  # (owner, key): a list or dict and its index, or an object and an attribute name


def state_slots(session: Any) -> list[Slot]:
    """Where each tensor that a decode step reads or writes in place lives, besides the weights: key/value slots,
    recurrent states, key positions, ring positions, the step's positions and each kind's mask."""
    cache = session.cache
    slots: list[Slot] = [
        (s, i) for s in (cache.key_cache, cache.value_cache) for i, t in enumerate(s) if t is not None
    ]
    slots += [(states, name) for states in cache.layer_states.values() for name in states]
    slots += [(cache, "key_positions"), *((cache.ring_cache_positions, kind) for kind in cache.ring_cache_positions)]
    slots += [(session, "cache_position"), (session, "position_ids")]
    slots += [(mask, name) for mask in session.decode_masks.values() for name in ("mask", "opening", "leaving")]
    return slots


def read(slot: Slot) -> torch.Tensor:
    owner, key = slot
    return owner[key] if isinstance(owner, list | dict) else getattr(owner, key)


def write(slot: Slot, value: torch.Tensor) -> None:
    owner, key = slot
    if isinstance(owner, list | dict):
        owner[key] = value
    else:
        setattr(owner, key, value)


class DecodeStep(nn.Module):
    """One greedy step with the session's state tensors as inputs (so that export sees them as graph inputs that
    the step mutates, not as constants): `(token [batch], *states) -> next token [batch]`."""

    def __init__(self, model: nn.Module, session: Any) -> None:
        super().__init__()
        self.model = model
        self._session = [session]  # in a list: export would otherwise walk the session's tensors as attributes

    def forward(self, token: torch.Tensor, *states: torch.Tensor) -> torch.Tensor:
        session = self._session[0]
        for slot, value in zip(state_slots(session), states, strict=True):
            write(slot, value)
        return self.model._decode_one_token(session, token).argmax(-1)


def package_step(
    model: nn.Module, session: Any, token: torch.Tensor, options: dict[str, Any], max_args: int | None, path: str
) -> Any:
    """Export and compile the decode step for `session`'s shapes into `path`; returns the loaded step, bound to
    the model's weights (not copied). `max_args`: inductor's CPU backend puts consecutive loops into one C++
    function until it takes more than this many arguments (500: a whole-model step is three functions)."""
    slots = state_slots(session)
    states = [read(slot) for slot in slots]
    step = DecodeStep(model, session)
    try:
        with torch.no_grad(), whole_graph(), inputs_checked():
            exported = torch.export.export(step, (token, *states), strict=False)
    finally:
        for slot, value in zip(slots, states, strict=True):
            write(slot, value)  # export leaves fake tensors behind
    with mock.patch.object(
        CppScheduling, "MAX_FUSED_KERNEL_ARGS_NUM", max_args or CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM
    ):
        torch._inductor.aoti_compile_and_package(
            exported,
            package_path=path,
            inductor_configs={
                "aot_inductor.package_constants_in_so": False,
                "cpp.enable_kernel_profile": True,
                **options,
            },
        )
    loaded = torch._inductor.aoti_load_package(path)
    weights = dict(step.named_parameters(remove_duplicate=False)) | dict(step.named_buffers(remove_duplicate=False))
    loaded.load_constants(
        {name: weights[name] for name in loaded.get_constant_fqns()}, check_full_update=True, user_managed=True
    )
    return loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--quantization", default=None, choices=("int8", "int4"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tokens", type=int, default=64, help="decode steps timed")
    parser.add_argument("--variants", nargs="+", default=["stack"], choices=list(VARIANTS))
    args = parser.parse_args()
    torch._inductor.config.cpp.enable_kernel_profile = True  # generated kernels appear by name in the profile
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype, quantization=args.quantization)
    ids = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    n = args.tokens
    reference = model.generate(ids, max_new_tokens=n + 1, eos_token_id=None, do_sample=False, compile=True)[0, 16:]
    config, _, _ = model._generation_config(None, {"max_new_tokens": n + 1, "do_sample": False})
    with inputs_checked():
        session, logits = model._prefill_static(ids, torch.ones_like(ids), config, n + 1, None)
    states = [read(slot) for slot in state_slots(session)]

    def packaged_loop(step: Any) -> Callable[[profile | None], tuple[float, float, torch.Tensor]]:
        @torch.no_grad()  # the prefill too: no autograd record on the cache
        def run(profiler: profile | None = None) -> tuple[float, float, torch.Tensor]:
            with inputs_checked():
                fresh, first = model._prefill_static(ids, torch.ones_like(ids), config, n + 1, None)
            for state, slot in zip(states, state_slots(fresh), strict=True):
                state.copy_(read(slot))  # the packaged step is bound to `session`'s tensors
            token = first.argmax(-1)
            tokens = [token]
            if profiler is not None:
                profiler.start()
            start = time.perf_counter()
            for _ in range(n):
                token = step(token, *states)
                tokens.append(token)
            end = time.perf_counter()
            if profiler is not None:
                profiler.stop()
            return start, end, torch.stack(tokens, dim=1)[0]

        return run

    regional = torch.compile(steps_function(model, 1), fullgraph=True, dynamic=False, options=cpu_inductor_options())
    begin = time.perf_counter()
    decode(model, ids, config, 1, n, regional)
    loops: dict[str, Callable[..., tuple[float, float, torch.Tensor]]] = {
        "regional (generate's)": lambda profiler=None: decode(model, ids, config, 1, n, regional, profiler)
    }
    first_calls = {"regional (generate's)": time.perf_counter() - begin}
    with tempfile.TemporaryDirectory() as directory:
        for variant in args.variants:
            begin = time.perf_counter()
            options, max_args = VARIANTS[variant]
            step = package_step(model, session, logits.argmax(-1), options, max_args, f"{directory}/{variant}.pt2")
            first_calls[f"AOTInductor, {variant}"] = time.perf_counter() - begin
            loops[f"AOTInductor, {variant}"] = packaged_loop(step)
        runs: dict[str, list[tuple[float, float, torch.Tensor]]] = defaultdict(list)
        splits: dict[str, list[tuple[float, float]]] = defaultdict(list)  # per profiled run: (kernels, outside)
        for _ in range(5):  # alternated: the host's drift spreads over every variant
            for name, loop in loops.items():
                runs[name].append(loop())
                prof = profile(activities=[ProfilerActivity.CPU])
                start, end, _ = loop(prof)
                events = prof.key_averages()
                kernels = sum(e.self_cpu_time_total for e in events if group_of(e.key).startswith(KERNELS)) / 1e3 / n
                # wall clock less the kernels: the C++ wrapper's own time has no profiler event
                splits[name].append((kernels, (end - start) / n * 1e3 - kernels))
        print(
            "| decode step | first call s | ms/token | kernels ms/token | outside kernels, profiled ms/token "
            "| outside kernels, unprofiled ms/token | generate's tokens |\n|:---|---:|---:|---:|---:|---:|:---|"
        )
        for name in loops:
            ms = statistics.median((end - start) / n * 1e3 for start, end, _ in runs[name])
            kernels = statistics.median(k for k, _ in splits[name])
            outside = statistics.median(o for _, o in splits[name])
            same = all(torch.equal(tokens[: n + 1], reference[: n + 1]) for _, _, tokens in runs[name])
            print(
                f"| {name} | {first_calls[name]:.1f} | {ms:.2f} | {kernels:.2f} | {outside:.2f} | {ms - kernels:.2f} "
                f"| {same} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
