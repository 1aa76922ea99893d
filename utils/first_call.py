"""First-call time of a compiled generate, each in a fresh process, on a cold then a warm compile cache.

    python utils/first_call.py MODEL_DIR [--variants regional,full,upstream] [--dtype float32]

For each variant: a process on an empty inductor cache directory (cold), then a second process on the same
directory (warm: inductor's FX graph and AOTAutograd caches hit, dynamo still traces), then a process on another
empty directory that first loads the cache artifacts the cold process saved (`torch.compiler.save_cache_artifacts`
/ `load_cache_artifacts`: what a cache shipped to another machine gives). Variants: ours `generate(compile=True)`
by regions ("regional") or as one graph ("full"), and upstream's compiled static-cache generate ("upstream").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROMPT_LEN, NEW_TOKENS = 16, 16


def child(model_dir: str, variant: str, dtype: str, save: str | None, load: str | None) -> None:
    """Runs in the measured process: one first call, its time printed as JSON."""
    import torch

    if load:
        torch.compiler.load_cache_artifacts(Path(load).read_bytes())
    ids = torch.randint(3, 1000, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    generate = _first_call(model_dir, variant, getattr(torch, dtype))
    torch.compile(lambda x: torch.relu(x) * 2, fullgraph=True)(torch.randn(8))  # the compiler's process start-up
    start = time.perf_counter()
    generate(ids)
    seconds = time.perf_counter() - start
    if save:
        artifacts = torch.compiler.save_cache_artifacts()
        Path(save).write_bytes(artifacts[0] if artifacts else b"")
    print(json.dumps({"first_call_s": seconds}))


def _first_call(model_dir: str, variant: str, dtype: Any) -> Callable[[Any], Any]:
    """The model loaded, and the call to time: ours `generate(compile=variant)`, or upstream compiled as the bench
    runs it (bench/runners.py: static cache of what ours allocates, its CompileConfig)."""
    import torch

    from transformers_static import AutoModelForCausalLM
    from transformers_static.bench.runners import upstream_variants
    from transformers_static.generation import GenerationConfig

    if variant != "upstream":
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        return lambda ids: model.generate(ids, max_new_tokens=NEW_TOKENS, eos_token_id=None, compile=variant)
    max_cache_len = GenerationConfig().static_cache_len(PROMPT_LEN, NEW_TOKENS)
    cpu = torch.device("cpu")
    _, compiled = upstream_variants(
        Path(model_dir), dtype=dtype, device=cpu, compile=True, max_cache_len=max_cache_len
    )
    if compiled.run is None:
        raise SystemExit(f"upstream: {compiled.note}")
    return lambda ids: compiled.run(ids, NEW_TOKENS, None)


def measure(model_dir: str, variant: str, dtype: str, cache_dir: str, *extra: str) -> float:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    cmd = [sys.executable, __file__, model_dir, "--child", variant, "--dtype", dtype, *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["first_call_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--variants", default="regional,full,upstream")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model_dir, args.child, args.dtype, args.save, args.load)
        return 0
    print("| variant | cold cache s | warm cache (same dir) s | artifacts loaded into an empty dir s |")
    print("|:---|---:|---:|---:|")
    for variant in args.variants.split(","):
        with tempfile.TemporaryDirectory() as cold, tempfile.TemporaryDirectory() as other:
            artifacts = os.path.join(other, "artifacts.bin")
            first = measure(args.model_dir, variant, args.dtype, cold, "--save", artifacts)
            warm = measure(args.model_dir, variant, args.dtype, cold)
            loaded = measure(args.model_dir, variant, args.dtype, os.path.join(other, "cache"), "--load", artifacts)
        print(f"| {variant} | {first:.1f} | {warm:.1f} | {loaded:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
