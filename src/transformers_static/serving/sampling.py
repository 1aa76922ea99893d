"""Per-row sampling for a batch of independent requests, and the host side of their text (detokenization, stops).

Every request's settings are a row of a tensor (`greedy`, `temperature`, `top_p`), so one function samples any
mix of requests; its randomness is a row of exponential noise drawn from the request's own generator (seeded
requests are reproducible whatever else is in the batch): `argmax(p / E)` with `E ~ Exp(1)` picks token i with
probability p_i.
"""

from __future__ import annotations

from typing import Any

import torch


def sample_rows(
    logits: torch.Tensor,
    *,
    greedy: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """One token per row of `logits` `[batch, vocab]`: argmax where `greedy` `[batch]`, else a draw at that row's
    `temperature` `[batch]` from the smallest set of tokens whose probability reaches its `top_p` `[batch]`, using
    `noise` `[batch, vocab]` (Exp(1); None when no row samples)."""
    picked = logits.argmax(-1)  # [batch]
    if noise is None:
        return picked
    probs = torch.softmax(logits.float() / temperature.clamp(min=1e-5)[:, None], dim=-1)  # [batch, vocab]
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above each one
    dropped = (before >= top_p[:, None]).scatter(-1, order, before >= top_p[:, None])  # the first is always kept
    drawn = (probs.masked_fill(dropped, 0) / noise).argmax(-1)  # [batch]
    return torch.where(greedy, picked, drawn)


class TextStream:
    """A request's text as its tokens arrive: what may be sent now, and where a stop string ends it.

    Text is decoded from all tokens so far (merges and multi-byte characters come out right); a tail that is an
    incomplete character, or could still grow into a stop string, is held back until it is settled."""

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.tokenizer, self.stops = tokenizer, [s for s in stops if s]
        self.tokens: list[int] = []
        self.sent = 0  # characters already handed out

    def add(self, token: int) -> tuple[str, bool]:
        """Append `token`; returns (new text to send, whether a stop string was reached: the text ends before it)."""
        self.tokens.append(token)
        text = self.decode()
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            return self._take(text, max(cut, self.sent)), True
        settled = len(text) - self._held(text)
        return self._take(text, max(settled, self.sent)), False

    def flush(self) -> str:
        """The rest of the text once the request ends without a stop string."""
        return self._take(self.decode(), None)

    def decode(self) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def _held(self, text: str) -> int:
        """Characters at the end of `text` not yet settled: an incomplete character, or a stop string's prefix."""
        if text.endswith("\ufffd"):
            return len(text) - len(text.rstrip("\ufffd"))
        return max((n for s in self.stops for n in range(len(s) - 1, 0, -1) if text.endswith(s[:n])), default=0)

    def _take(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        new = text[self.sent : end]
        self.sent = max(self.sent, end)
        return new
