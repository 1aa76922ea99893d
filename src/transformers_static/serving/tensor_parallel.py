"""`serve --tp` under torchrun: rank 0 serves HTTP and runs the engine; every rank runs the same forwards.

Before each forward, rank 0's engine thread broadcasts what it is (a header: prefill chunk, decode step, or stop)
and its inputs packed in one int64 tensor of a size every rank knows from the shared command line; the other ranks
(`follow`) unpack and run the same forward on their shard of the model and their heads of the cache, so the
collectives inside the forward meet. Only rank 0 samples (every rank's logits are the same, gathered).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .engine import Engine

PREFILL, DECODE, STOP = 0, 1, 2


class BroadcastForward:
    """Rank 0's forward: announce the forward to the other ranks, then run it. `close` tells them to stop."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.forward = engine, engine.forward

    def __call__(self, **inputs: Any) -> Any:
        prefill = inputs["past_key_values"] is self.engine.prefill_view
        kind = PREFILL if prefill else DECODE
        rows = self.engine.prefill_view.rows if prefill else None
        parts = [inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"], inputs["cache_position"]]
        payload = torch.cat([p.reshape(-1).long() for p in parts] + ([rows] if prefill else []))
        dist.broadcast(torch.tensor([kind]), src=0)
        dist.broadcast(payload.cpu(), src=0)
        return self.forward(**inputs)

    def close(self) -> None:
        dist.broadcast(torch.tensor([STOP]), src=0)
        dist.barrier()  # every rank has left its loop: the process groups can go down


def follow(engine: Engine) -> None:
    """Ranks other than 0: run every forward rank 0 announces, until it stops."""
    batch, slots, chunk = engine.max_batch, engine.cache.max_cache_len, engine.chunk
    device = engine.model.device
    with torch.inference_mode():
        while True:
            header = torch.empty(1, dtype=torch.long)
            dist.broadcast(header, src=0)
            if int(header) == STOP:
                dist.barrier()
                return
            size = 3 * chunk + slots + 1 if int(header) == PREFILL else 3 * batch + batch * slots
            payload = torch.empty(size, dtype=torch.long)
            dist.broadcast(payload, src=0)
            engine.forward(**_unpack(engine, int(header), payload.to(device), batch, slots, chunk))


def _unpack(engine: Engine, kind: int, payload: torch.Tensor, batch: int, slots: int, chunk: int) -> dict[str, Any]:
    """The forward's keyword arguments from a broadcast payload (the layout BroadcastForward packs)."""
    if kind == PREFILL:
        ids, padding, positions, cache_position, row = payload.split([chunk, slots, chunk, chunk, 1])
        engine.prefill_view.rows.copy_(row)
        return dict(
            input_ids=ids[None],
            attention_mask=padding[None].bool(),
            position_ids=positions[None],
            past_key_values=engine.prefill_view,
            cache_position=cache_position,
            logits_to_keep=1,
        )
    ids, padding, positions, cache_position = payload.split([batch, batch * slots, batch, batch])
    return dict(
        input_ids=ids[:, None],
        attention_mask=padding.reshape(batch, slots).bool(),
        position_ids=positions[:, None],
        past_key_values=engine.cache,
        cache_position=cache_position[:, None],
        logits_to_keep=1,
    )
