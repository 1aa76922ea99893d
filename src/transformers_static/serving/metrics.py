"""The server's Prometheus metrics (text exposition format 0.0.4), updated by the engine thread, read by /metrics."""

from __future__ import annotations

import bisect
import threading

PREFIX = "transformers_static"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus histograms expose them."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += count
            out.append(f'{name}_bucket{{le="{"+Inf" if bound == float("inf") else bound}"}} {total}')
        return [*out, f"{name}_sum {self.sum}", f"{name}_count {self.count}"]


class Metrics:
    """Requests by outcome, tokens, queue depth, slot occupancy, time to first token and inter-token latency."""

    def __init__(self, slots: int) -> None:
        self.lock = threading.Lock()
        self.slots = slots
        self.requests: dict[str, int] = {}  # finish reason -> count
        self.prompt_tokens = self.generation_tokens = 0
        self.queue_depth = self.busy_slots = 0
        self.ttft = Histogram()
        self.itl = Histogram()

    def finished(self, reason: str) -> None:
        with self.lock:
            self.requests[reason] = self.requests.get(reason, 0) + 1

    def render(self) -> str:
        with self.lock:
            lines = [
                f"# HELP {PREFIX}_requests_total Requests finished, by finish reason.",
                f"# TYPE {PREFIX}_requests_total counter",
                *(f'{PREFIX}_requests_total{{finish_reason="{k}"}} {v}' for k, v in sorted(self.requests.items())),
                f"# HELP {PREFIX}_prompt_tokens_total Prompt tokens prefilled.",
                f"# TYPE {PREFIX}_prompt_tokens_total counter",
                f"{PREFIX}_prompt_tokens_total {self.prompt_tokens}",
                f"# HELP {PREFIX}_generation_tokens_total Tokens generated.",
                f"# TYPE {PREFIX}_generation_tokens_total counter",
                f"{PREFIX}_generation_tokens_total {self.generation_tokens}",
                f"# HELP {PREFIX}_queue_depth Requests waiting for a slot.",
                f"# TYPE {PREFIX}_queue_depth gauge",
                f"{PREFIX}_queue_depth {self.queue_depth}",
                f"# HELP {PREFIX}_slots_busy Slots holding a request.",
                f"# TYPE {PREFIX}_slots_busy gauge",
                f"{PREFIX}_slots_busy {self.busy_slots}",
                f"# HELP {PREFIX}_slots Slots (rows of the static cache).",
                f"# TYPE {PREFIX}_slots gauge",
                f"{PREFIX}_slots {self.slots}",
                f"# HELP {PREFIX}_time_to_first_token_seconds From arrival to the first token.",
                f"# TYPE {PREFIX}_time_to_first_token_seconds histogram",
                *self.ttft.lines(f"{PREFIX}_time_to_first_token_seconds"),
                f"# HELP {PREFIX}_inter_token_latency_seconds Between consecutive tokens of a request.",
                f"# TYPE {PREFIX}_inter_token_latency_seconds histogram",
                *self.itl.lines(f"{PREFIX}_inter_token_latency_seconds"),
            ]
        return "\n".join(lines) + "\n"
