"""`transformers-static bench --prompt-lookup K`: prompt-lookup decoding against plain greedy decoding, both through
`generate(compile=True)` (or both eager), on a task whose answer copies its prompt (repeating a passage).

Per variant: the mean decode time per new token (from the first new token to the last, so the prefill is left out),
the prefill time, and for prompt lookup the verify steps, the new tokens per verify step and the acceptance rate
(drafts kept / drafts proposed). The drafts of each step are those `lookup_candidates` proposes for the text at that
step's start (a step's kept tokens arrive as one streamer put). Both variants must make the same tokens (prompt
lookup is exact under greedy decoding); the host's copy bandwidth is measured in the same run.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..generation.candidate_generator import DEFAULT_MAX_MATCHING_NGRAM_SIZE, lookup_candidates
from .measure import decode_weight_bytes, load_average, memory_bandwidth_gbps
from .runners import load_ours

COPY_TASK = (
    "Repeat the following passage word for word:\n\n"
    "The river rises in the hills above the town and runs south through the valley for forty miles before it meets "
    "the sea. In spring the snow melts and the water rises quickly; the farmers along its banks move their animals "
    "to higher ground and wait. By summer the river is low and slow, and children swim in the deep pools below the "
    "old stone bridge. In autumn the leaves of the willows turn yellow and fall into the water, and the current "
    "carries them past the mill, under the bridge and out towards the marshes, where the herons stand and wait for "
    "the fish that come up with the tide."
)


@dataclass
class LookupResult:
    """One variant's timings (ms) over the timed runs, and for prompt lookup its verify-step counts."""

    name: str
    decode_ms_per_token: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    new_tokens: int = 0
    verify_steps: int | None = None
    drafted: int | None = None
    accepted: int | None = None

    def median_ms(self) -> float:
        return statistics.median(self.decode_ms_per_token)


class BurstStreamer:
    """Timestamps each `put` and keeps its tokens: the first put is the prompt, then one per decode or verify step."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stamps: list[float] = []
        self.bursts: list[list[int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())
        self.bursts.append(value.flatten().tolist())

    def end(self) -> None:
        pass


def prompt_ids(path: Path) -> torch.Tensor:
    """The copy task through the checkpoint's chat template (or as plain text): `[1, prompt_len]`."""
    from ..models.auto import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"bench --prompt-lookup needs the checkpoint's tokenizer ({path}): {err}") from err
    if tokenizer.chat_template is not None:
        messages = [{"role": "user", "content": COPY_TASK}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    else:
        ids = tokenizer.encode(COPY_TASK)
    return torch.tensor([ids])


def run_prompt_lookup_bench(
    path: Path,
    *,
    num_tokens: int,
    new_tokens: int,
    repeats: int,
    dtype: torch.dtype,
    device: torch.device,
    out: Path,
    compile: bool = True,
) -> dict[str, Any]:
    """Plain greedy decoding and prompt lookup with `num_tokens` drafts per verify step, compiled or both eager:
    `repeats` timed runs each after a warm-up (compiling) run. Writes `out/prompt_lookup.json`; returns it."""
    bandwidth = memory_bandwidth_gbps(device)
    model = load_ours(path, dtype=dtype, device=device)
    ids = prompt_ids(path).to(device)
    variants = {"plain": {}, f"prompt-lookup-{num_tokens}": {"prompt_lookup_num_tokens": num_tokens}}
    results, outputs = [], {}
    for name, options in variants.items():
        result = LookupResult(name)
        for run in range(repeats + 1):  # the first run compiles
            streamer = BurstStreamer()
            sequences = model.generate(ids, max_new_tokens=new_tokens, streamer=streamer, compile=compile, **options)
            new = sequences[0, ids.shape[1] :].tolist()
            if run == 0:
                continue
            stamps, bursts = streamer.stamps[1:], streamer.bursts[1:]  # the prompt's put dropped
            result.prefill_ms.append((stamps[0] - streamer.start) * 1e3)
            result.decode_ms_per_token.append((stamps[-1] - stamps[0]) * 1e3 / max(len(new) - 1, 1))
            result.new_tokens = len(new)
            if options:
                result.verify_steps, result.drafted, result.accepted = _lookup_counts(
                    ids, bursts, num_tokens, new_tokens
                )
        outputs[name] = new
        results.append(result)
    plain, lookup = results
    floor_ms = decode_weight_bytes(model) / (bandwidth * 1e9) * 1e3
    report = {
        "machine": {"device": str(device), "memory_bandwidth_gbps": bandwidth, "load_average": load_average()},
        "model": str(path),
        "dtype": str(dtype).removeprefix("torch."),
        "compile": compile,
        "prompt_tokens": ids.shape[1],
        "max_new_tokens": new_tokens,
        "repeats": repeats,
        "same_tokens": outputs[plain.name] == outputs[lookup.name],
        "floor_ms_per_token": floor_ms,
        "speedup": plain.median_ms() / lookup.median_ms(),
        "variants": [asdict(result) for result in results],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompt_lookup.json").write_text(json.dumps(report, indent=2))
    return report


def _lookup_counts(
    ids: torch.Tensor, bursts: list[list[int]], num_tokens: int, max_new_tokens: int
) -> tuple[int, int, int]:
    """(verify steps, drafts proposed, drafts kept) of one prompt-lookup run from its streamed bursts: the first
    burst is the prefill's token, each later one a verify step's kept tokens."""
    text = ids[0].tolist() + bursts[0]
    drafted = accepted = 0
    for burst in bursts[1:]:
        limit = max_new_tokens - (len(text) - ids.shape[1]) - 1
        drafted += len(lookup_candidates(text, min(num_tokens, limit), DEFAULT_MAX_MATCHING_NGRAM_SIZE))
        accepted += len(burst) - 1
        text += burst
    return len(bursts) - 1, drafted, accepted


def format_lookup_table(report: dict[str, Any]) -> str:
    """The report as a Markdown table, with the floor and whether both variants made the same tokens."""
    lines = [
        "| variant | decode ms/token (median) | prefill ms | new tokens | verify steps | tokens/verify | acceptance |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in report["variants"]:
        steps = result["verify_steps"]
        per_step = f"{result['new_tokens'] / steps:.2f}" if steps else "1"
        acceptance = f"{result['accepted'] / result['drafted']:.0%}" if result["drafted"] else "-"
        lines.append(
            f"| {result['name']} | {statistics.median(result['decode_ms_per_token']):.2f} | "
            f"{statistics.median(result['prefill_ms']):.1f} | {result['new_tokens']} | {steps or result['new_tokens']} | "
            f"{per_step} | {acceptance} |"
        )
    lines.append(
        f"\nspeed-up {report['speedup']:.2f}x (prompt lookup / plain: {1 / report['speedup']:.2f}x the ms per token); "
        f"same tokens: {report['same_tokens']}; host copy bandwidth {report['machine']['memory_bandwidth_gbps']:.1f} "
        f"GB/s, weight-read floor {report['floor_ms_per_token']:.2f} ms/token"
    )
    return "\n".join(lines)
