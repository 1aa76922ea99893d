"""The serving engine: continuous batching on static slots, one scheduler thread that owns the model.

A slot is a row of one StaticCache of `max_batch` rows. A request waits in a first-come-first-served queue until a
slot is free, is prefilled into its row one chunk at a time (between decode steps, so a joining request delays the
others by at most one chunk), then decodes with every busy slot in one step. Its prompt is left-padded to whole
chunks, as `generate` pads it (positions from the padding mask, padding slots masked), so a greedy request gives
`generate`'s tokens. Two forward signatures, whatever the mix of requests:

    prefill chunk   input_ids [1, chunk]      mask [1, slots]          cache_position [chunk]       (StaticCache.rows)
    decode step     input_ids [max_batch, 1]  mask [max_batch, slots]  cache_position [max_batch, 1] (per row)

The chunk runs through `StaticCache.rows` (a view writing and attending one row, chosen by a device tensor), not
through the full batch with the other rows masked: a chunk costs one row's products instead of `max_batch` rows'.
Every row has its own cache position in the decode step; an idle row (or one still prefilling) writes the spare
last slot, which no request reaches, and its logits are ignored. Other requests' leftovers in a row lie after the
new request's slots (hidden by causality) or in its padding (hidden by its padding mask).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..cache_utils import DEFAULT_PREFILL_CHUNK_SIZE, StaticCache
from ..modeling_inputs import inputs_checked
from .metrics import Metrics
from .sampling import TextStream, sample_rows

logger = logging.getLogger(__name__)


class EngineError(ValueError):
    """A request the engine cannot take (too long, bad ids); `status` is the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Event:
    """What a request's consumer receives: new text and token ids; the last event has a finish reason."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", "cancelled", "error" (a failed step)
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[Event], None]  # called from the engine thread; must not block
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    index: int = field(default_factory=itertools.count().__next__)  # arrival order

    def cancel(self) -> None:
        """Ask the engine to drop this request (a client gone); its slot is freed before the next step."""
        self.cancelled = True


@dataclass(eq=False)
class _Slot:
    """A request in a row: prefilling (chunks left) or decoding."""

    request: Request
    text: TextStream
    padded: list[int]  # the prompt left-padded to whole chunks
    pad: int
    chunks: int
    generator: torch.Generator | None
    chunks_done: int = 0
    generated: int = 0
    last_token_at: float = 0.0

    @property
    def prefilling(self) -> bool:
        return self.chunks_done < self.chunks


class Engine:
    """Owns `model` on its scheduler thread; `submit` queues a request, events arrive through its sink."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_batch: int = 4,
        max_len: int = 2048,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK_SIZE,
        forward: Callable[..., Any] | None = None,
        eos_token_ids: list[int] | None = None,
    ) -> None:
        if max_batch < 1 or max_len < 2 or prefill_chunk < 1:
            raise ValueError(
                f"Engine needs max_batch >= 1, max_len >= 2, prefill_chunk >= 1; got {max_batch}, {max_len}, "
                f"{prefill_chunk}"
            )
        table = getattr(model, "max_positions", None)
        if table is not None and max_len > table:
            raise ValueError(
                f"max_len {max_len} is longer than {type(model).__name__}'s position table of {table} positions "
                "(config n_positions / max_position_embeddings)"
            )
        self.model, self.tokenizer, self.forward = model, tokenizer, forward or model
        self.max_batch, self.max_len, self.chunk = max_batch, max_len, prefill_chunk
        self.eos = set(eos_token_ids if eos_token_ids is not None else _eos_ids(model))
        device = model.device
        # a prompt padded to whole chunks plus its new tokens fit in max_len + chunk - 1 slots; the last is spare
        capacity = max_len + prefill_chunk
        self.scratch = capacity - 1
        # full-length slots for every layer (no sliding-window rings: rows sit at different positions)
        self.cache = StaticCache(model.config, max_batch, capacity, model.dtype, device, prefill_chunk_size=capacity)
        self.prefill_view = self.cache.rows(torch.zeros(1, dtype=torch.long, device=device))
        self.padding = torch.ones(max_batch, capacity, dtype=torch.bool, device=device)  # [max_batch, slots]
        # The spare slot is padding for every row: rows not decoding (idle, or mid-prefill) feed their decode-step
        # token there, which then attends other keys but not itself, so a recurrent layer skips it as padding.
        self.padding[:, self.scratch] = False
        self.slots: list[_Slot | None] = [None] * max_batch
        self.next_token = [0] * max_batch  # host copies of the decode step's per-row inputs
        self.cache_slot = [self.scratch] * max_batch
        self.position = [0] * max_batch
        self.queue: collections.deque[Request] = collections.deque()
        self.cond = threading.Condition()
        self.metrics = Metrics(max_batch)
        self.stopping = False
        self.steps = 0  # decode steps run
        self.thread = threading.Thread(target=self._run, name="transformers-static-engine", daemon=True)

    # ------------------------------------------------------------------ public
    def start(self) -> Engine:
        self.thread.start()
        return self

    def submit(self, request: Request) -> Request:
        """Queue `request` (checked first: an EngineError if it cannot fit)."""
        self.check(request.prompt_ids, request.params.max_tokens)
        with self.cond:
            if self.stopping:
                raise EngineError("the server is shutting down", status=503)
            self.queue.append(request)
            self.metrics.queue_depth = len(self.queue)
            self.cond.notify()
        return request

    def check(self, prompt_ids: list[int], max_tokens: int) -> None:
        """An EngineError when a prompt is empty, holds ids outside the vocabulary, or does not fit `max_len`."""
        vocab = self.model.config.vocab_size
        if not prompt_ids:
            raise EngineError("the prompt is empty", param="prompt")
        if any(not 0 <= i < vocab for i in prompt_ids):
            raise EngineError(f"the prompt holds token ids outside the vocabulary [0, {vocab})", param="prompt")
        if len(prompt_ids) >= self.max_len:
            raise EngineError(
                f"the prompt has {len(prompt_ids)} tokens; this server's context (--max-len) is {self.max_len} "
                "tokens, prompt and completion together",
                status=413,
                param="messages",
            )
        if max_tokens < 1 or len(prompt_ids) + max_tokens > self.max_len:
            raise EngineError(
                f"max_tokens must be between 1 and {self.max_len - len(prompt_ids)} (--max-len {self.max_len} minus "
                f"the prompt's {len(prompt_ids)} tokens), got {max_tokens}",
                param="max_tokens",
            )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking requests, cancel those still queued or running (their sinks get "cancelled"), and join."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    @property
    def busy(self) -> int:
        return sum(slot is not None for slot in self.slots)

    # ------------------------------------------------------------------ scheduler
    def _run(self) -> None:
        """The scheduler loop; on exit, `forward.close()` if the forward has one (tensor parallel: the other ranks
        stop with it)."""
        try:
            with torch.inference_mode(), inputs_checked():  # requests are checked on submit: no host reads per step
                while self._schedule():
                    try:
                        self._step()
                    except Exception:  # a failed forward fails the requests in it, not the server
                        logger.exception("engine step failed; its requests end with an error")
                        for row, slot in enumerate(self.slots):
                            if slot is not None:
                                self._finish(row, "error")
        finally:
            close = getattr(self.forward, "close", None)
            if close is not None:
                close()

    def _step(self) -> None:
        """One prefill chunk of the oldest prefilling request, then one decode step for every decoding row."""
        prefilling = [i for i, s in enumerate(self.slots) if s is not None and s.prefilling]
        if prefilling:
            self._prefill_chunk(min(prefilling, key=lambda i: self.slots[i].request.index))
        if any(s is not None and not s.prefilling for s in self.slots):
            self._decode_step()

    def _schedule(self) -> bool:
        """Drop cancelled requests, admit queued ones into free slots; wait while idle. False once stopped."""
        with self.cond:
            while True:
                for row, slot in enumerate(self.slots):
                    if slot is not None and (slot.request.cancelled or self.stopping):
                        self._finish(row, "cancelled")
                for request in [r for r in self.queue if r.cancelled or self.stopping]:
                    self.queue.remove(request)
                    _emit(request, Event("", [], "cancelled", len(request.prompt_ids)))
                    self.metrics.finished("cancelled")
                while self.queue and None in self.slots:
                    self._admit(self.slots.index(None), self.queue.popleft())
                self.metrics.queue_depth, self.metrics.busy_slots = len(self.queue), self.busy
                if self.stopping:
                    return False
                if self.busy:
                    return True
                self.cond.wait(0.5)

    def _admit(self, row: int, request: Request) -> None:
        n = len(request.prompt_ids)
        padded_len = -(-n // self.chunk) * self.chunk
        pad = padded_len - n
        padded = [0] * pad + request.prompt_ids
        generator = None
        if not request.params.greedy:
            seed = request.params.seed if request.params.seed is not None else torch.seed()
            generator = torch.Generator(device=self.model.device).manual_seed(seed)
        tokenizer_stream = TextStream(self.tokenizer, request.params.stop)
        self.slots[row] = _Slot(request, tokenizer_stream, padded, pad, padded_len // self.chunk, generator)
        self.padding[row, :pad] = False  # the padding slots are never attended
        self.padding[row, pad:] = True
        self.padding[row, self.scratch] = False  # nor the spare slot (see _decode_step)

    def _prefill_chunk(self, row: int) -> None:
        """One chunk of row `row`'s prompt into its row; after the last, its first token."""
        slot = self.slots[row]
        device = self.model.device
        start = slot.chunks_done * self.chunk
        positions = (torch.arange(start, start + self.chunk) - slot.pad).clamp(min=0)  # padding slots: 0
        self.prefill_view.rows.fill_(row)
        logits = self.forward(
            input_ids=torch.tensor([slot.padded[start : start + self.chunk]], device=device),  # [1, chunk]
            attention_mask=self.padding.index_select(0, self.prefill_view.rows),  # [1, slots]
            position_ids=positions[None].to(device),  # [1, chunk]
            past_key_values=self.prefill_view,
            cache_position=torch.arange(start, start + self.chunk, device=device),
            logits_to_keep=1,
        ).logits[:, -1]  # [1, vocab]
        slot.chunks_done += 1
        if slot.prefilling:
            return
        self.metrics.prompt_tokens += len(slot.request.prompt_ids)
        params = slot.request.params
        picked = sample_rows(
            logits,
            greedy=torch.tensor([params.greedy], device=device),
            temperature=torch.tensor([params.temperature], device=device),
            top_p=torch.tensor([params.top_p], device=device),
            noise=self._noise([slot], logits),
        )
        self.next_token[row], self.cache_slot[row] = int(picked[0]), len(slot.padded)
        self.position[row] = len(slot.request.prompt_ids)
        self._deliver(row, self.next_token[row])

    def _decode_step(self) -> None:
        """One token for every decoding row, in one forward of all `max_batch` rows."""
        device = self.model.device
        logits = self.forward(
            input_ids=torch.tensor(self.next_token, device=device)[:, None],  # [max_batch, 1]
            attention_mask=self.padding,  # [max_batch, slots]
            position_ids=torch.tensor(self.position, device=device)[:, None],
            past_key_values=self.cache,
            cache_position=torch.tensor(self.cache_slot, device=device)[:, None],  # [max_batch, 1], per row
            logits_to_keep=1,
        ).logits[:, -1]  # [max_batch, vocab]
        self.steps += 1
        decoding = [s if s is not None and not s.prefilling else None for s in self.slots]
        params = [s.request.params if s is not None else SamplingParams(1, 0.0) for s in decoding]
        picked = sample_rows(
            logits,
            greedy=torch.tensor([p.greedy for p in params], device=device),
            temperature=torch.tensor([p.temperature for p in params], device=device),
            top_p=torch.tensor([p.top_p for p in params], device=device),
            noise=self._noise(decoding, logits),
        ).tolist()  # the step's one host read
        for row, slot in enumerate(decoding):
            if slot is not None:
                self.next_token[row] = picked[row]
                self.cache_slot[row] += 1
                self.position[row] += 1
                self._deliver(row, picked[row])

    def _noise(self, slots: list[_Slot | None], logits: torch.Tensor) -> torch.Tensor | None:
        """Exp(1) noise `[rows, vocab]` from each sampling row's own generator; None when every row is greedy."""
        if all(s is None or s.generator is None for s in slots):
            return None
        noise = torch.ones(logits.shape, dtype=torch.float32, device=logits.device)
        for row, slot in enumerate(slots):
            if slot is not None and slot.generator is not None:
                noise[row].exponential_(generator=slot.generator)
        return noise

    def _deliver(self, row: int, token: int) -> None:
        """Hand `token` of row `row` to its request; finish it on EOS, a stop string or its last token."""
        slot = self.slots[row]
        now = time.perf_counter()
        if slot.generated == 0:
            self.metrics.ttft.observe(now - slot.request.arrived)
        else:
            self.metrics.itl.observe(now - slot.last_token_at)
        slot.generated += 1
        slot.last_token_at = now
        self.metrics.generation_tokens += 1
        if token in self.eos:
            return self._finish(row, "stop", [token], slot.text.flush())
        text, stopped = slot.text.add(token)
        if stopped:
            return self._finish(row, "stop", [token], text)
        if slot.generated >= slot.request.params.max_tokens:
            return self._finish(row, "length", [token], text + slot.text.flush())
        _emit(slot.request, Event(text, [token]))

    def _finish(self, row: int, reason: str, token_ids: list[int] | None = None, text: str = "") -> None:
        """The request's slot free at once (an idle row writes the spare slot) and counted, then its last event: a
        client holding its answer sees the metrics with its request done."""
        slot = self.slots[row]
        self.slots[row] = None
        self.next_token[row], self.cache_slot[row], self.position[row] = 0, self.scratch, 0
        self.padding[row] = True  # an idle row attends its own stale keys: finite, ignored
        self.padding[row, self.scratch] = False
        self.metrics.finished(reason)
        self.metrics.busy_slots = self.busy
        _emit(slot.request, Event(text, token_ids or [], reason, len(slot.request.prompt_ids), slot.generated))


def _emit(request: Request, event: Event) -> None:
    try:
        request.sink(event)
    except RuntimeError:  # the consumer's event loop is closed: nobody is listening
        request.cancel()


def _eos_ids(model: Any) -> list[int]:
    """The model's EOS ids (generation config, else model config)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
