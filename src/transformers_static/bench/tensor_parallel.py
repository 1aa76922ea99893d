"""`transformers-static bench --tp N`: tensor-parallel decode next to one process, on the same checkpoint.

For each scenario (model x batch x prompt length), eager and (unless --no-compile) `generate(compile=True)`:

- one process: the calls run here, with torch's default thread count;
- N ranks: the same calls in N processes launched by torchrun (`python -m torch.distributed.run`), the model loaded
  with `tp_plan="auto"` on the same --device (gloo on the CPU, NCCL on CUDA); torchrun gives each rank
  OMP_NUM_THREADS=1 unless it is set, so both variants use the machine's cores.

Each makes a first call (compile included, on a cold compile cache as in the driver), a call at a new prompt length
(the graphs it compiles), then `repeats` timed runs: decode ms/token is the mean gap between new tokens, median over
runs. Rank 0 reports, and its tokens are compared with the one process's.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..integrations.tensor_parallel import end_command
from ..models.auto import AutoConfig, AutoModelForCausalLM
from .driver import BenchOptions, Scenario, _prompts, cold_compile_cache
from .measure import TimingStreamer, graphs_compiled, load_average
from .presets import checkpoint_path, model_label

COLUMNS = ("scenario", "variant", "processes x threads", "first call s", "ms/token median [min-max]", "graphs", "= 1p")
LAUNCH_TIMEOUT_S = 3600


def run_tp_benchmark(options: BenchOptions, world_size: int) -> dict[str, Any]:
    """Every scenario in one process and over `world_size` ranks; results.json-style dict, also written to
    `options.out / "tp_results.json"`."""
    rows = []
    for model in options.models:
        path = checkpoint_path(model)
        config = AutoConfig.from_pretrained(path)
        for batch in options.batches:
            for prompt_len in options.prompt_lens:
                scenario = Scenario(model_label(model), path, config, batch, prompt_len)
                for compiled in (False, True) if options.compile else (False,):
                    rows += _compare(scenario, options, world_size, compiled)
    results = {"world_size": world_size, "load_average": load_average(), "rows": rows, "options": _spec(options)}
    options.out.mkdir(parents=True, exist_ok=True)
    with open(options.out / "tp_results.json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    return results


def _compare(scenario: Scenario, options: BenchOptions, world_size: int, compiled: bool) -> list[dict[str, Any]]:
    mode = "compiled" if compiled else "eager"
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(scenario.path, dtype=options.dtype, device_map=options.device)
    single = measure(model, _prompts(scenario, options), options, compiled)
    spec = {**_spec(options), "model": scenario.model, "path": str(scenario.path), "device": str(options.device)}
    spec.update(batch=scenario.batch, prompt_len=scenario.prompt_len)
    split = launch_ranks({**spec, "compiled": compiled}, world_size)
    split["tokens_match"] = split.pop("tokens") == single.pop("tokens")
    return [
        {"scenario": scenario.label, "variant": f"1 process {mode}", "processes": 1, **single},
        {"scenario": scenario.label, "variant": f"tp {world_size} {mode}", "processes": world_size, **split},
    ]


def _spec(options: BenchOptions) -> dict[str, Any]:
    return {
        "new_tokens": options.new_tokens,
        "repeats": options.repeats,
        "dtype": str(options.dtype).removeprefix("torch."),
        "seed": options.seed,
    }


def measure(model: Any, prompts: tuple[torch.Tensor, torch.Tensor], options: BenchOptions, compiled: bool) -> dict:
    """A first call (timed, compile included) and one at a new prompt length, on a cold compile cache as in the
    driver, then the timed runs."""

    def generate(prompt: torch.Tensor, streamer: TimingStreamer | None = None) -> torch.Tensor:
        streamer = streamer or TimingStreamer()
        return model.generate(
            prompt, max_new_tokens=options.new_tokens, eos_token_id=None, compile=compiled, streamer=streamer
        )

    with cold_compile_cache(compiled):
        before, start = graphs_compiled(), time.perf_counter()
        tokens = generate(prompts[0])
        first_call_s, first = time.perf_counter() - start, graphs_compiled() - before
        generate(prompts[1])
    runs = []
    for _ in range(options.repeats):
        streamer = TimingStreamer()
        generate(prompts[0], streamer)
        runs.append(streamer.decode_ms_per_token())
    return {
        "threads": torch.get_num_threads(),
        "first_call_s": first_call_s,
        "graphs_first_call": first,
        "graphs_new_prompt_len": graphs_compiled() - before - first,
        "ms_per_token": {"median": statistics.median(runs), "min": min(runs), "max": max(runs)},
        "tokens": tokens.tolist(),
    }


def launch_ranks(spec: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Run `spec` on `world_size` ranks under torchrun and return rank 0's measurement. The launch gets its own
    process group, killed whole if it outlives LAUNCH_TIMEOUT_S."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_file.write_text(json.dumps({**spec, "out": str(out_file)}))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}"]
        command += ["-m", __name__, str(spec_file)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if process.returncode != 0:
            tail = output.decode(errors="replace")[-3000:]
            raise RuntimeError(f"the tensor-parallel ranks failed (exit {process.returncode}):\n{tail}")
        return json.loads(out_file.read_text())


def _rank_main(spec_file: str) -> None:
    """One rank of `launch_ranks`: the checkpoint split over the ranks, measured; rank 0 writes the result."""
    spec = json.loads(Path(spec_file).read_text())
    path = Path(spec["path"])
    options = BenchOptions(
        models=[spec["model"]], new_tokens=spec["new_tokens"], repeats=spec["repeats"], seed=spec["seed"]
    )
    dtype = getattr(torch, spec["dtype"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=spec["device"], tp_plan="auto")
    options.device = model.device
    scenario = Scenario(spec["model"], path, model.config, spec["batch"], spec["prompt_len"])
    result = measure(model, _prompts(scenario, options), options, spec["compiled"])
    if torch.distributed.get_rank() == 0:
        Path(spec["out"]).write_text(json.dumps(result))
    end_command()


def format_tp_table(results: dict[str, Any]) -> str:
    """The rows as an aligned text table, and a note on what the numbers mean."""
    rows = [[str(cell) for cell in _cells(row)] for row in results["rows"]]
    widths = [max(len(r[i]) for r in [list(COLUMNS), *rows]) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [COLUMNS, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines.append(
        f"\n{results['options']['new_tokens']} new tokens, {results['options']['repeats']} timed runs, load average "
        f"{results['load_average']}. Every decode step of a tp run all-reduces twice per layer and all-gathers the "
        "logits; on a CPU with gloo those round trips cost more than the matrix-vector work they split "
        "(docs/TENSOR_PARALLEL.md)."
    )
    return "\n".join(lines)


def _cells(row: dict[str, Any]) -> list[Any]:
    ms = row["ms_per_token"]
    match = {True: "yes", False: "NO"}.get(row.get("tokens_match"), "-")
    return [
        row["scenario"],
        row["variant"],
        f"{row['processes']} x {row['threads']}",
        f"{row['first_call_s']:.2f}",
        f"{ms['median']:.3f} [{ms['min']:.3f}-{ms['max']:.3f}]",
        f"{row['graphs_first_call']} / {row['graphs_new_prompt_len']}",
        match,
    ]


if __name__ == "__main__":
    _rank_main(sys.argv[1])
