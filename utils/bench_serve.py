"""Load test of `transformers-static serve`: aggregate output tokens/s with N concurrent streams against 1 stream,
and p50/p95 time to first token (TTFT) and inter-token latency (ITL), as a table and JSON.

    .venv/bin/python utils/bench_serve.py            # 1 stream on 1 slot, 1 stream on 8 slots, 8 streams on 8 slots
    .venv/bin/python utils/bench_serve.py --url http://host:8000 --model NAME --levels 1x0 8x0   # a running server

A server's decode step runs all its slots whatever their occupancy, so one stream on 8 slots pays for 8 rows: the
baseline is one stream on a 1-slot server (started per slot count, on the SmolLM2 preset by default).

Each request streams a chat completion (greedy, `max_tokens` new tokens; EOS may end one earlier, the counts come
from the server's usage). TTFT: from sending to the first content chunk; ITL: the gaps between content chunks
(one chunk per token, except where the server holds text back: a partial character or a stop-string prefix).
Speed only: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from urllib.parse import urlparse

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is.",
    "Give three tips for learning a language.",
    "Why is the sky blue?",
    "Name five fruits and their colours.",
    "What does a compiler do?",
    "Describe a cat in two sentences.",
]


def stream_one(host: str, port: int, model: str, question: str, max_tokens: int) -> dict:
    """One streamed request: its TTFT, chunk gaps and completion tokens."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = http.client.HTTPConnection(host, port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    response = conn.getresponse()
    times, tokens = [], 0
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            times.append(time.perf_counter())
    conn.close()
    gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
    return {"ttft": times[0] - start if times else float("nan"), "gaps": gaps, "tokens": tokens}


def run_load(host: str, port: int, model: str, streams: int, requests: int, max_tokens: int) -> dict:
    """`requests` requests, `streams` at a time; aggregate tokens/s over the wall time."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        jobs = [
            pool.submit(stream_one, host, port, model, QUESTIONS[i % len(QUESTIONS)], max_tokens)
            for i in range(requests)
        ]
        results = [job.result() for job in jobs]
    wall = time.perf_counter() - start
    ttfts = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in results)
    return {
        "streams": streams,
        "requests": requests,
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "itl_p50_s": percentile(gaps, 50),
        "itl_p95_s": percentile(gaps, 95),
    }


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def start_server(args: argparse.Namespace, slots: int) -> tuple[subprocess.Popen, int]:
    """`transformers-static serve` on the preset with `slots` slots, on a free port, once healthy."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "transformers_static", "serve", "--preset", args.preset, "--port", str(port)]
    command += ["--max-batch", str(slots), "--max-len", str(args.max_len), "--model-name", args.model]
    if args.compile:
        command.append("--compile")
    if args.threads:
        command += ["--threads", str(args.threads)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with status {process.returncode}: {' '.join(command)}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return process, port
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise SystemExit("the server did not start in time")


def measure(args: argparse.Namespace, host: str, port: int, streams: int, slots: int | None) -> dict:
    stream_one(host, port, args.model, QUESTIONS[0], 4)  # warm-up (first-call costs, compile)
    row = run_load(host, port, args.model, streams, streams * args.requests_per_stream, args.max_tokens)
    return {**row, "slots": slots}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running server (default: start one per slot count on --preset)")
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--model", default="smollm2-135m", help="the model id to send")
    parser.add_argument(
        "--levels",
        nargs="+",
        default=["1x1", "1x8", "8x8"],
        help="STREAMSxSLOTS: concurrent streams against a server of SLOTS slots (first: the baseline)",
    )
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--compile", action="store_true", help="start the servers with --compile")
    parser.add_argument("--threads", type=int, help="start the servers with --threads N")
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    levels = [tuple(int(n) for n in level.split("x")) for level in args.levels]
    rows = []
    if args.url:
        parsed = urlparse(args.url)
        rows = [measure(args, parsed.hostname, parsed.port or 80, streams, None) for streams, _ in levels]
    else:
        for slots in dict.fromkeys(slots for _, slots in levels):
            process, port = start_server(args, slots)
            try:
                rows += [measure(args, "127.0.0.1", port, n, slots) for n, s in levels if s == slots]
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(120)
    base = rows[0]["tokens_per_s"]
    print(
        "| streams | slots | requests | output tok | wall s | tok/s | x baseline | TTFT p50 / p95 s | ITL p50 / p95 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['slots']} | {r['requests']} | {r['output_tokens']} | {r['wall_s']:.1f} "
            f"| {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f} | {r['ttft_p50_s']:.2f} / "
            f"{r['ttft_p95_s']:.2f} | {1e3 * r['itl_p50_s']:.0f} / {1e3 * r['itl_p95_s']:.0f} |"
        )
    report = {"preset": args.preset, "compile": args.compile, "threads": args.threads, "max_tokens": args.max_tokens,
              "rows": rows, "cpu_count": os.cpu_count(), "load_average": os.getloadavg()}  # fmt: skip
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
