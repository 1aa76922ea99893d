"""`transformers-static serve`: an OpenAI-compatible HTTP server over continuous batching on static slots.

engine.py    the scheduler thread: slots (rows of one StaticCache), chunked prefill, one decode step for all
sampling.py  per-row greedy / temperature / top-p sampling, and incremental detokenization with stop strings
protocol.py  OpenAI's request and response schema, and its error JSON
metrics.py   Prometheus counters, gauges and histograms
app.py       the FastAPI app (needs the `serve` extra: fastapi, uvicorn)
"""

from .engine import Engine, EngineError, Event, Request, SamplingParams

__all__ = ["Engine", "EngineError", "Event", "Request", "SamplingParams"]
