"""llama.cpp on the same host, the bar a CPU user compares with: `bench --llama-cpp DIR` (a llama.cpp build's folder
holding `llama-bench` and `llama-quantize`) requantizes the model's GGUF to each weight type the run measures
(`llama-quantize --allow-requantize`: the same weights as ours, which reads that GGUF dequantized) and reads
`llama-bench`'s decode speed at the run's prompt length, new tokens and thread count."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

# our weight type -> llama.cpp's
LLAMA_CPP_TYPES = {"float32": "F32", "bfloat16": "BF16", "int8": "Q8_0", "int4": "Q4_0"}
TOOLS = ("llama-bench", "llama-quantize")
TIMEOUT_S = 900  # one tool call


def check_build(bin_dir: Path) -> None:
    """A ValueError naming what is missing, before anything runs."""
    missing = [tool for tool in TOOLS if not (bin_dir / tool).is_file()]
    if missing:
        raise ValueError(
            f"--llama-cpp {bin_dir}: no {', '.join(missing)} there; pass the folder of a llama.cpp build's binaries "
            "(e.g. build/bin after `cmake --build build --target llama-bench llama-quantize`)"
        )


def decode_ms_per_token(
    bin_dir: Path,
    gguf: Path,
    weights: list[str],
    *,
    prompt_len: int,
    new_tokens: int,
    repeats: int,
    threads: int,
    workdir: Path,
) -> dict[str, float]:
    """llama.cpp's decode ms/token for each of `weights` (our names: float32, bfloat16, int8, int4) on `gguf`
    requantized into `workdir` (reused when already there)."""
    figures = {}
    workdir.mkdir(parents=True, exist_ok=True)
    for weight in weights:
        kind = LLAMA_CPP_TYPES[weight]
        target = workdir / f"{gguf.stem}-{kind}.gguf"
        if not target.is_file():
            partial = target.with_suffix(".partial")
            _run([bin_dir / "llama-quantize", "--allow-requantize", gguf, partial, kind])
            partial.replace(target)
        bench = [bin_dir / "llama-bench", "-m", target, "-t", threads, "-p", prompt_len, "-n", new_tokens]
        rows = json.loads(_run([*bench, "-r", repeats, "-o", "json"]))
        generation = [row for row in rows if row["n_gen"] > 0 and row["n_prompt"] == 0]
        if not generation:
            raise RuntimeError(f"llama-bench reported no generation test for {target}: {rows}")
        figures[weight] = 1000.0 / generation[0]["avg_ts"]
    return figures


def _run(command: list[object]) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode:
        raise RuntimeError(f"{' '.join(map(str, command))} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout
