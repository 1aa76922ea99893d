"""Host-side stopping: stop strings and the time limit, checked between decode steps (never inside a compiled step).

The EOS check reads the step's tokens on the host once per step; these checks use the same read."""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

import torch


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


class StopStrings:
    """Upstream's StopStringCriteria rule: a row stops once its text (prompt included) holds a stop string that
    overlaps its last token. Decodes only each row's last few tokens (one token is at least one character)."""

    def __init__(self, stop_strings: str | list[str], tokenizer: Tokenizer | None, prompts: list[list[int]]) -> None:
        if tokenizer is None:
            raise ValueError(
                "stop_strings are set (in the call or the model's generation config) but no tokenizer was given: "
                "pass the model's tokenizer as generate(..., tokenizer=tokenizer)"
            )
        self.stop_strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
        if not self.stop_strings or not all(isinstance(s, str) and s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be a non-empty string or list of them, got {stop_strings!r}")
        self.tokenizer = tokenizer
        self.window = max(len(s) for s in self.stop_strings) + 2  # tokens kept per row
        self.tails = [prompt[-self.window :] for prompt in prompts]

    def __call__(self, tokens: list[int]) -> list[bool]:
        """Add one token per row; True for each row whose text now ends in a stop string."""
        found = []
        for tail, token in zip(self.tails, tokens, strict=True):
            tail.append(token)
            del tail[: -self.window]
            found.append(self._ends_in_stop_string(tail))
        return found

    def _ends_in_stop_string(self, tail: list[int]) -> bool:
        text = self._decode(tail)
        before = len(os.path.commonprefix([self._decode(tail[:-1]), text]))  # where the last token's text starts
        return any(text.find(s, max(before - len(s) + 1, 0)) != -1 for s in self.stop_strings)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class HostStops:
    """What ends generation besides EOS and max_new_tokens, checked on the host after each step."""

    def __init__(self, stop_strings: StopStrings | None, max_time: float | None) -> None:
        self.stop_strings = stop_strings
        self.deadline = None if max_time is None else time.monotonic() + max_time

    def update(self, token: torch.Tensor, finished: torch.Tensor) -> bool:
        """Mark rows that ended in a stop string as `finished` `[batch]` (in place); True when time is up."""
        if self.stop_strings is not None:
            matched = self.stop_strings(token.tolist())
            finished |= torch.tensor(matched, dtype=torch.bool, device=finished.device)
        return self.deadline is not None and time.monotonic() > self.deadline
