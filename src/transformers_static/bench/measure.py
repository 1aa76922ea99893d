"""Measurement helpers: per-token timestamps, compiled-graph counts, peak memory, memory bandwidth."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn


class TimingStreamer:
    """A generate streamer that timestamps each `put`: the first holds the prompt, each later one a new token."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stamps: list[float] = []
        self.tokens: list[torch.Tensor] = []

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())
        self.tokens.append(value)

    def end(self) -> None:
        pass

    @property
    def token_stamps(self) -> list[float]:
        """Times at which each new token arrived (the prompt's put is dropped)."""
        return self.stamps[1:]

    def prefill_ms(self) -> float:
        """From the generate call to the first new token: prefill plus picking one token."""
        return (self.token_stamps[0] - self.start) * 1e3

    def decode_ms_per_token(self) -> float:
        """Mean time between consecutive new tokens (steady-state decode; the prefill is excluded)."""
        stamps = self.token_stamps
        if len(stamps) < 2:
            return float("nan")
        return (stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1)


def graphs_compiled() -> int:
    """How many graphs torch._dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass
class PeakMemory:
    """Peak memory over a block, in MB: the CUDA allocator's peak on CUDA, the process's RSS high-water on CPU.

    On Linux the RSS high-water mark is reset at the start (`/proc/self/clear_refs`), so each block gets its own
    peak; where that is not possible it is the process's peak so far (`reset` False)."""

    device: torch.device
    peak_mb: float = 0.0
    start_mb: float = 0.0
    reset: bool = field(default=False)

    @contextmanager
    def track(self) -> Iterator[PeakMemory]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_mb, self.reset = torch.cuda.memory_allocated(self.device) / 2**20, True
            yield self
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        self.reset = _reset_rss_peak()
        self.start_mb = current_rss_mb()
        yield self
        self.peak_mb = rss_peak_mb()


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident set size (Linux >= 4.0)
        return True
    except OSError:
        return False


def _proc_status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def current_rss_mb() -> float:
    return _proc_status_mb("VmRSS") or 0.0


def rss_peak_mb() -> float:
    """Peak resident set size: VmHWM where /proc exists, else getrusage's ru_maxrss (kB on Linux, B on macOS)."""
    hwm = _proc_status_mb("VmHWM")
    if hwm is not None:
        return hwm
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024


def memory_bandwidth_gbps(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Copy bandwidth in GB/s (bytes read + bytes written per second, STREAM's convention), best of `repeats`."""
    numel = megabytes * 2**20 // 4
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # faults the destination's pages in: not timed
    best = float("inf")
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * numel * 4 / best / 1e9


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step must read: every parameter and buffer once (int8 weights and their scales
    are buffers), except embedding tables that only serve a row lookup (a tied output head does read its table in
    full, so that one counts)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = head if head is not None else getattr(model, "lm_head", None)
    head_weight = getattr(head, "weight", None)
    lookup_only = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and m.weight is not head_weight
    }
    seen: set[int] = set()
    total = 0
    for param in (*model.parameters(), *model.buffers()):
        if id(param) in lookup_only or id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel() * param.element_size()
    return total


def load_average() -> list[float] | None:
    """1/5/15-minute load averages (other work on the machine skews timings), or None where unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def busy_warning(load: list[float] | None = None) -> str | None:
    """A warning when the 1-minute load (now, or the `load` recorded) is above half the CPUs, else None."""
    load = load_average() if load is None else load
    cpus = os.cpu_count() or 1
    if load is None or load[0] <= 0.5 * cpus:
        return None
    return f"load average {load[0]:.1f} on {cpus} CPUs: timings will be noisy"
