"""Streamers for `generate(streamer=...)`, printing or queueing the same text upstream's do: text is released at word
boundaries (up to the last space), whole after a newline, and at once for CJK characters."""

from __future__ import annotations

import asyncio
from queue import Queue
from typing import Any

import torch


class BaseStreamer:
    """`generate` calls `put(prompt_ids)`, then `put(new_token_ids)` per step, then `end()`."""

    def put(self, value: torch.Tensor) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError


class TextStreamer(BaseStreamer):
    """Print decoded text to stdout as soon as whole words are formed (batch size 1).

    `skip_prompt=True` leaves the prompt out; `decode_kwargs` (e.g. `skip_special_tokens=True`) go to
    `tokenizer.decode`.
    """

    def __init__(self, tokenizer: Any, skip_prompt: bool = False, **decode_kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.decode_kwargs = decode_kwargs
        self.token_cache: list[int] = []
        self.print_len = 0
        self.next_tokens_are_prompt = True

    def put(self, value: torch.Tensor) -> None:
        """Decode what has arrived since the last release and release the printable part."""
        if value.dim() > 1 and value.shape[0] > 1:
            raise ValueError("TextStreamer only supports batch size 1")
        if value.dim() > 1:
            value = value[0]
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            return
        self.token_cache.extend(value.tolist())
        text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
        if text.endswith("\n"):  # a finished line: release it all and start a new cache
            printable, self.token_cache, self.print_len = text[self.print_len :], [], 0
        elif text and _is_chinese_char(ord(text[-1])):  # CJK characters are words of their own
            printable = text[self.print_len :]
            self.print_len += len(printable)
        else:  # hold back the last, possibly unfinished, word
            printable = text[self.print_len : text.rfind(" ") + 1]
            self.print_len += len(printable)
        self.on_finalized_text(printable)

    def end(self) -> None:
        """Release what is left, then end the stream (a newline for TextStreamer)."""
        printable = ""
        if self.token_cache:
            printable = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)[self.print_len :]
            self.token_cache, self.print_len = [], 0
        self.next_tokens_are_prompt = True
        self.on_finalized_text(printable, stream_end=True)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        print(text, flush=True, end=None if stream_end else "")


class TextIteratorStreamer(TextStreamer):
    """Queue the released text for a consumer in another thread: `for text in streamer: ...` while `generate` runs
    in a `Thread`. `timeout` (seconds) bounds each wait on the queue (queue.Empty when it passes)."""

    def __init__(self, tokenizer: Any, skip_prompt: bool = False, timeout: float | None = None, **decode_kwargs: Any):
        super().__init__(tokenizer, skip_prompt, **decode_kwargs)
        self.text_queue: Queue = Queue()
        self.stop_signal = None
        self.timeout = timeout

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.text_queue.put(text, timeout=self.timeout)
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)

    def __iter__(self) -> TextIteratorStreamer:
        return self

    def __next__(self) -> str:
        value = self.text_queue.get(timeout=self.timeout)
        if value == self.stop_signal:
            raise StopIteration
        return value


class AsyncTextIteratorStreamer(TextStreamer):
    """`async for text in streamer` while `generate` runs in a thread; create it inside the running event loop.
    `timeout` bounds each wait (TimeoutError)."""

    def __init__(self, tokenizer: Any, skip_prompt: bool = False, timeout: float | None = None, **decode_kwargs: Any):
        super().__init__(tokenizer, skip_prompt, **decode_kwargs)
        self.text_queue: asyncio.Queue = asyncio.Queue()
        self.stop_signal = None
        self.timeout = timeout
        self.loop = asyncio.get_running_loop()

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.loop.call_soon_threadsafe(self.text_queue.put_nowait, text)
        if stream_end:
            self.loop.call_soon_threadsafe(self.text_queue.put_nowait, self.stop_signal)

    def __aiter__(self) -> AsyncTextIteratorStreamer:
        return self

    async def __anext__(self) -> str:
        async with asyncio.timeout(self.timeout):
            value = await self.text_queue.get()
        if value == self.stop_signal:
            raise StopAsyncIteration
        return value


# Unicode blocks of CJK ideographs (the "CJK Unified Ideographs" blocks and their compatibility forms).
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def _is_chinese_char(cp: int) -> bool:
    return any(low <= cp <= high for low, high in _CJK_RANGES)
