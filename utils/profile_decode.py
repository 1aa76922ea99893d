"""Where a compiled decode step goes: torch.profiler over steady-state decode steps of generate(compile=...).

    python utils/profile_decode.py MODEL_DIR [--compile regional|full|max-autotune] [--quantization int8|int4]
                                   [--dtype float32] [--batch 1]

Prints the step time (wall clock, between tokens), the profiled self time per group of events, per step (the
generated kernels, which hold the linear layers' reductions; attention; aten products; dynamo's lookups and
wrappers; the eager ops between compiled regions), then the profiler's own table of the top events.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

import torch
import torch._inductor.config
from torch.profiler import ProfilerActivity, profile

from transformers_static import AutoModelForCausalLM
from transformers_static.bench.measure import TimingStreamer

GROUPS = (  # first match wins: (label, pattern on the profiler event name)
    ("attention (aten SDPA, called by the generated code)", r"aten::_scaled_dot_product|aoti_torch_cpu__scaled_dot"),
    (
        "generated kernels (linear reductions or GEMM templates fused with norms, activations, residuals, rotary, "
        "cache write)",
        r"cpp_fused|cpp_CppMicro|triton_|graph_\d+_cpp",
    ),
    ("aten mm (F.linear)", r"aten::(mm|addmm|bmm)$|aoti_torch_cpu_(mm|addmm|bmm)"),
    ("the compiled graph's own code (Python or C++ wrapper: allocations, calls)", r"CompiledFxGraph"),
    (
        "dynamo: cache lookup (guards), pre-graph bytecode, AOT wrapper, region calls",
        r"TorchDynamo Cache Lookup|Pregraph bytecode|AOTDispatcher|Torch-Compiled Region",
    ),
)


def group_of(name: str) -> str:
    for label, pattern in GROUPS:
        if re.search(pattern, name):
            return label
    return "other aten ops (eager glue)"


class DecodeProfiler:
    """A generate streamer that profiles from the first new token to the end: the decode steps only."""

    def __init__(self) -> None:
        self.puts = 0
        self.prof = profile(activities=[ProfilerActivity.CPU])

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:  # the prompt, then the first new token (made by the prefill)
            self.prof.start()

    def end(self) -> None:
        self.prof.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--compile", default="regional", choices=("regional", "full", "max-autotune"))
    parser.add_argument("--quantization", default=None, choices=("int8", "int4"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    torch._inductor.config.cpp.enable_kernel_profile = True  # generated kernels appear by name in the profile
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=getattr(torch, args.dtype), quantization=args.quantization
    )
    ids = torch.randint(3, 1000, (args.batch, 16), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=args.steps + 1, eos_token_id=None, compile=args.compile)
    model.generate(ids, **kwargs)  # compile
    streamer = TimingStreamer()
    model.generate(ids, streamer=streamer, **kwargs)
    profiler = DecodeProfiler()
    model.generate(ids, streamer=profiler, **kwargs)
    totals: dict[str, float] = defaultdict(float)
    for event in profiler.prof.key_averages():
        totals[group_of(event.key)] += event.self_cpu_time_total / 1e3 / args.steps
    print(f"decode step (wall, unprofiled): {streamer.decode_ms_per_token():.2f} ms")
    print("| piece of one decode step | profiled self ms per step |\n|:---|---:|")
    for label, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {ms:.2f} |")
    print(f"| total profiled | {sum(totals.values()):.2f} |")
    print(profiler.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=90))
    return 0


if __name__ == "__main__":
    sys.exit(main())
