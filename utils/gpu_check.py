"""Decode timing on CUDA: ours eager vs generate(compile=True) (CUDA graphs, mode="reduce-overhead").

    python utils/gpu_check.py [--preset llama-125m] [--batch 1] [--new-tokens 64]

Prints one row per dtype: first call (compile and recording included), decode ms/token (median of the timed runs),
CUDA graphs recorded over all compiled calls, cudagraph skips, and whether the tokens equal eager's. Run by
`make gpu-check` after tests/test_cuda_graphs.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from transformers_static import AutoModelForCausalLM
from transformers_static.bench.measure import TimingStreamer
from transformers_static.bench.presets import preset_path


def recordings(device: torch.device) -> int:
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_container(device.index or 0).tree_manager
    return 0 if manager is None else manager.new_graph_id().id


def decode_ms(
    model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, compile: bool
) -> tuple[float, torch.Tensor]:
    streamer = TimingStreamer()
    out = model.generate(prompt, max_new_tokens=new_tokens, eos_token_id=None, streamer=streamer, compile=compile)
    return streamer.decode_ms_per_token(), out


def check(preset: str, dtype: torch.dtype, batch: int, new_tokens: int, repeats: int) -> list[str]:
    torch._dynamo.reset()
    counters.clear()
    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(preset_path(preset), dtype=dtype, device_map=device)
    prompt = torch.randint(3, model.config.vocab_size, (batch, 16), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    _, eager = decode_ms(model, prompt, new_tokens, compile=False)
    start = time.perf_counter()
    _, compiled = decode_ms(model, prompt, new_tokens, compile=True)
    first_call = time.perf_counter() - start
    decode_ms(model, prompt[:, 3:].contiguous(), new_tokens, compile=True)  # another prompt length: replays
    times = {"eager": [], "compiled": []}
    for _ in range(repeats):
        for name in times:
            times[name].append(decode_ms(model, prompt, new_tokens, compile=name == "compiled")[0])
    eager_ms, compiled_ms = (statistics.median(times[name]) for name in ("eager", "compiled"))
    return [
        str(dtype).removeprefix("torch."),
        f"{first_call:.1f}",
        f"{eager_ms:.2f}",
        f"{compiled_ms:.2f}",
        f"{compiled_ms / eager_ms:.2f}x",
        str(recordings(device)),
        str(counters["inductor"]["cudagraph_skips"]),
        "yes" if torch.equal(eager, compiled) else "NO",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-125m")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False): nothing to measure", file=sys.stderr)
        return 1
    header = ["dtype", "first call s", "eager ms/token", "compiled ms/token", "compiled/eager", "recordings"]
    header += ["cudagraph skips", "tokens = eager"]
    rows = [
        check(args.preset, dtype, args.batch, args.new_tokens, args.repeats)
        for dtype in (torch.float32, torch.bfloat16)
    ]
    print(
        f"{args.preset}, batch {args.batch}, prompt 16, {args.new_tokens} new tokens, {torch.cuda.get_device_name()}"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
