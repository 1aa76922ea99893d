"""Assisted decoding (upstream's `assistant_model`): a draft model proposes tokens one at a time on its own static
cache, and the model checks them in one fixed-width verify step (`candidate_generator.candidate_decode`).

The draft's cache has the model's slot layout (same prompt padding, same chunking), so a draft token at slot s is
the model's token at slot s. Each draft step is a `[1, 1]` forward with the 2D padding mask at the cache's full
length and `cache_position` `[1]`: the model makes the 4D mask, and causality hides the slots of rejected drafts, so
rewinding the draft is moving its cursor back (no copy, no reset). A draft whose every token was accepted has not
yet stored its last one; that token is fed first in the next step (same shape). The draft compiles to its prefill
chunk graph and that one step graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .candidate_generator import Cursor, verify_width
from .configuration_utils import GenerationConfig
from .logits_process import LogitsProcessing, next_tokens

if TYPE_CHECKING:
    from .utils import _Session

# upstream's defaults for the assistant fields (its GenerationConfig's), read from the assistant's config there
ASSISTANT_DEFAULTS = {
    "num_assistant_tokens": 20,
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": 0.4,
}
SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def resolve_assistant_fields(config: GenerationConfig, assistant: Any) -> None:
    """Set the call's assistant fields in place: the call's value (generate's kwargs or generation_config), else
    the assistant's generation config (where upstream reads them), else upstream's defaults; then check them.

    Upstream reads these fields only from the assistant's generation config and ignores them when passed to
    generate: here the call's value wins, since only the speed depends on them (the output does not)."""
    own = getattr(assistant, "generation_config", None)
    for name, default in ASSISTANT_DEFAULTS.items():
        if getattr(config, name) is None:
            value = getattr(own, name, None)
            setattr(config, name, default if value is None else value)
    tokens = config.num_assistant_tokens
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"num_assistant_tokens must be an integer >= 1, got {tokens!r}")
    if config.num_assistant_tokens_schedule not in SCHEDULES:
        raise ValueError(
            f"num_assistant_tokens_schedule must be one of {SCHEDULES}, got {config.num_assistant_tokens_schedule!r}"
        )
    threshold = config.assistant_confidence_threshold
    if not 0 <= threshold < 1:
        raise ValueError(f"assistant_confidence_threshold must be in [0, 1), got {threshold!r}")


def check_assistant(model: Any, assistant: Any) -> None:
    """The assistant must be one of this library's generation models, on the model's device, with the same
    vocabulary (upstream's test for a shared tokenizer); a clear error otherwise."""
    if not callable(getattr(assistant, "_prefill_static", None)):
        raise TypeError(
            f"assistant_model must be a transformers_static causal LM (loaded with transformers_static's "
            f"from_pretrained), got {type(assistant).__module__}.{type(assistant).__name__}"
        )
    if assistant.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the assistant's vocab_size ({assistant.config.vocab_size}) differs from the model's "
            f"({model.config.vocab_size}): assisted decoding needs the same tokenizer (universal assisted decoding "
            "across tokenizers is not supported)"
        )
    if assistant.device != model.device:
        raise ValueError(f"the assistant is on {assistant.device} but the model is on {model.device}: move it")


class DraftModel:
    """A `CandidateSource` that drafts with the assistant, greedily or by sampling as the call does, for every row
    at once: `[batch, 1]` steps at per-row cursors (a row with nothing to feed at a step writes its last token at its
    cursor without moving on: the next real write overwrites it before anything reads it).

    `num_assistant_tokens` drafts per step (fewer near the end), a row stopping early after a draft whose
    probability is below `assistant_confidence_threshold` (upstream's ConfidenceCriteria, that draft kept); the
    "heuristic" schedules add 2 drafts after a step that kept all of a row's and remove 1 otherwise, per row, within
    the verify width."""

    def __init__(
        self,
        session: _Session,
        config: GenerationConfig,
        processing: LogitsProcessing,
        generator: torch.Generator | None,
        max_model_position: int | None,
    ) -> None:
        batch = session.position_ids.shape[0]
        self.session = session
        self.cursor = Cursor.of(session, max_model_position)
        self.width = verify_width(config)
        self.counts = [self.width] * batch  # drafts per step, per row
        self.adaptive = config.num_assistant_tokens_schedule != "constant"
        self.threshold = config.assistant_confidence_threshold
        self.do_sample = config.do_sample
        self.processing = processing  # stateless: the call's warpers, applied as the model's scores are
        self.generator = generator
        self.pending: list[list[int]] = [[] for _ in range(batch)]  # kept tokens not yet in the draft's cache
        self.padding = torch.ones(batch, session.capacity, dtype=torch.bool, device=session.cache_position.device)
        self.padding[:, : session.prompt_mask.shape[1]] = session.prompt_mask.bool()

    def propose(self, texts: list[list[int]], limits: list[int]) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        batch = len(texts)
        counts = [min(count, limit) for count, limit in zip(self.counts, limits, strict=True)]
        feeds = [[*pending, text[-1]] for pending, text in zip(self.pending, texts, strict=True)]
        drafting = [row for row in range(batch) if counts[row] > 0]
        for row in range(batch):  # nothing to draft: the tokens wait for the row's next step
            self.pending[row] = [] if row in drafting else feeds[row]
        drafts: list[list[int]] = [[] for _ in range(batch)]
        rows: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        if not drafting:
            return drafts, [None] * batch
        last = [text[-1] for text in texts]
        steps = max(len(feeds[row]) for row in drafting)
        for step in range(steps):  # the feeds, aligned at their ends
            tokens = {
                row: feeds[row][step - steps + len(feeds[row])] for row in drafting if step >= steps - len(feeds[row])
            }
            logits = self._step(tokens, last)
        while drafting:
            scores = self.processing(logits)  # [batch, vocab]
            picked = next_tokens(scores, self.do_sample, self.generator)  # [batch]
            confidence = scores.float().softmax(dim=-1).gather(1, picked[:, None])[:, 0].tolist()
            picks = picked.tolist()
            for row in drafting:
                drafts[row].append(picks[row])
                rows[row].append(scores[row])
            drafting = [
                row
                for row in drafting
                if len(drafts[row]) < counts[row] and not (self.threshold > 0 and confidence[row] < self.threshold)
            ]
            if drafting:
                logits = self._step({row: drafts[row][-1] for row in drafting}, last)
        draft_scores = [torch.stack(row) if self.do_sample and row else None for row in rows]  # [drafts, vocab]
        return drafts, draft_scores

    def accepted(self, drafts: list[list[int]], taken: list[int]) -> None:
        back = [0] * len(drafts)
        for row, (row_drafts, kept) in enumerate(zip(drafts, taken, strict=True)):
            if not row_drafts:
                continue
            if kept == len(row_drafts):
                self.pending[row] = [row_drafts[-1]]  # drafted, never fed: stored next step, before the model's token
            else:  # back to the slot after the last kept draft: the rejected ones there are overwritten in turn
                back[row] = -(len(row_drafts) - kept - 1)
            if self.adaptive:
                count = self.counts[row]
                self.counts[row] = min(self.width, count + 2) if kept == len(row_drafts) else max(1, count - 1)
        self.cursor.advance(back)

    def _step(self, tokens: dict[int, int], idle: list[int]) -> torch.Tensor:
        """Feed `tokens` {row: token} at their rows' cursors and move those on; the other rows feed `idle[row]` in
        place. The draft's logits `[batch, vocab]` for what follows each row's token."""
        session = self.session
        fed = [tokens.get(row, token) for row, token in enumerate(idle)]
        cache_position, position_ids = self.cursor.inputs(1)
        logits = session.forward(
            torch.tensor(fed, device=position_ids.device)[:, None],  # [batch, 1]
            attention_mask=self.padding,
            position_ids=position_ids,
            past_key_values=session.cache,
            cache_position=cache_position,
        ).logits[:, -1]
        self.cursor.advance([int(row in tokens) for row in range(len(idle))])
        return logits
