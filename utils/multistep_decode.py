"""The multi-step decode lever, measured: K greedy decode steps traced into one compiled call, against generate's one.

    python utils/multistep_decode.py MODEL_DIR [--quantization int8|int4] [--steps-per-call 1 4 8] [--tokens 64]

A prototype outside generate, for docs/BENCHMARK.md (issue 27, item 4): after generate's own prefill, one function
runs K decode steps (generate's `_decode_one_token`, then argmax) and is compiled whole
(`fullgraph=True, dynamic=False`, generate's CPU inductor options; the decoder layers stay one shared region), so
dynamo's per-call work (guards, collecting the weights as graph inputs) and the eager ops between steps are paid
once per K tokens. Later calls skip guard evaluation, as generate's steps do. Prints, per K: the first call (trace
and compile after `torch._dynamo.reset()`; the layer region comes from inductor's cache), ms a token (median of 3
runs), the profiled time a token spends in the generated kernels and outside them, and whether the tokens equal
`generate(compile=True)`'s greedy tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.config
from profile_decode import group_of
from torch.profiler import ProfilerActivity, profile

from transformers_static import AutoModelForCausalLM
from transformers_static.generation.compilation import cpu_inductor_options
from transformers_static.modeling_inputs import inputs_checked

KERNELS = "generated kernels"


def steps_function(model: Any, steps: int) -> Callable[..., torch.Tensor]:
    """`steps` greedy decode steps from `token` `[batch]`, each generate's own (`_decode_one_token`: mask advance,
    forward, positions moved on in place): returns their tokens `[batch, steps]`."""

    @torch.no_grad()
    def run(token: torch.Tensor, session: Any) -> torch.Tensor:
        tokens = []
        for _ in range(steps):
            token = model._decode_one_token(session, token).argmax(-1)  # [batch]
            tokens.append(token)
        return torch.stack(tokens, dim=1)

    return run


def decode(
    model: Any,
    ids: torch.Tensor,
    config: Any,
    k: int,
    n: int,
    compiled: Callable[..., torch.Tensor],
    profiler: profile | None = None,
) -> tuple[float, float, torch.Tensor]:
    """Prefill `ids` `[1, prompt]`, then `n` tokens in calls of `k` steps; returns the decode loop's start and end
    times and the tokens `[n + 1]` (the prefill's first). `profiler` runs over the loop only."""
    with inputs_checked():
        session, logits = model._prefill_static(ids, torch.ones_like(ids), config, n + k, None)
        tokens = [logits.argmax(-1)[:, None]]
        if profiler is not None:
            profiler.start()
        start = time.perf_counter()
        for call in range(n // k):
            # a fresh token of the same strides each call: the guards checked at the first call still hold
            token = tokens[-1][:, -1].clone(memory_format=torch.contiguous_format)
            with torch.compiler.set_stance(skip_guard_eval_unsafe=call > 0):
                tokens.append(compiled(token, session))
        end = time.perf_counter()
        if profiler is not None:
            profiler.stop()
    return start, end, torch.cat(tokens, dim=1)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--quantization", default=None, choices=("int8", "int4"))
    parser.add_argument("--steps-per-call", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=64, help="decode steps timed (a multiple of every K)")
    args = parser.parse_args()
    torch._inductor.config.cpp.enable_kernel_profile = True  # generated kernels appear by name in the profile
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, quantization=args.quantization)
    ids = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    n = args.tokens
    reference = model.generate(ids, max_new_tokens=n + 1, eos_token_id=None, do_sample=False, compile=True)[0, 16:]
    print(
        "| steps per call | first call s | ms/token (median of 3) | kernels ms/token | outside kernels ms/token "
        "| generate's tokens |\n|---:|---:|---:|---:|---:|:---|"
    )
    for k in args.steps_per_call:
        torch._dynamo.reset()  # each K from the same state: its own cache entry, the layer region recompiled
        config, _, _ = model._generation_config(None, {"max_new_tokens": n + k, "do_sample": False})
        compiled = torch.compile(
            steps_function(model, k), fullgraph=True, dynamic=False, options=cpu_inductor_options()
        )

        begin = time.perf_counter()
        with inputs_checked():
            session, logits = model._prefill_static(ids, torch.ones_like(ids), config, n + k, None)
            compiled(logits.argmax(-1), session)
        first_call = time.perf_counter() - begin
        runs = [decode(model, ids, config, k, n, compiled) for _ in range(3)]
        ms = statistics.median((end - start) / (n // k * k) * 1e3 for start, end, _ in runs)
        same = all(torch.equal(tokens[: n + 1], reference[: n + 1]) for _, _, tokens in runs)
        prof = profile(activities=[ProfilerActivity.CPU])
        decode(model, ids, config, k, n, compiled, prof)
        totals: dict[bool, float] = defaultdict(float)
        for event in prof.key_averages():
            totals[group_of(event.key).startswith(KERNELS)] += event.self_cpu_time_total / 1e3 / (n // k * k)
        print(f"| {k} | {first_call:.1f} | {ms:.2f} | {totals[True]:.2f} | {totals[False]:.2f} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
