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

from .candidate_generator import verify_width
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
    """A `CandidateSource` that drafts with the assistant, greedily or by sampling as the call does.

    `num_assistant_tokens` drafts per step (fewer near the end), stopping early after a draft whose probability is
    below `assistant_confidence_threshold` (upstream's ConfidenceCriteria, that draft kept); the "heuristic"
    schedules add 2 drafts after a step that accepted all and remove 1 otherwise, within the verify width."""

    def __init__(
        self,
        session: _Session,
        config: GenerationConfig,
        processing: LogitsProcessing,
        generator: torch.Generator | None,
        max_model_position: int | None,
    ) -> None:
        self.session = session
        self.width = verify_width(config)
        self.count = self.width
        self.adaptive = config.num_assistant_tokens_schedule != "constant"
        self.threshold = config.assistant_confidence_threshold
        self.do_sample = config.do_sample
        self.processing = processing  # stateless: the call's warpers, applied as the model's scores are
        self.generator = generator
        self.pending: list[int] = []  # accepted tokens not yet in the draft's cache (before the last token)
        self.padding = torch.ones(1, session.capacity, dtype=torch.bool, device=session.cache_position.device)
        self.padding[:, : session.prompt_mask.shape[1]] = session.prompt_mask.bool()
        self.last_position = None if max_model_position is None else max_model_position - 1

    def propose(self, tokens: list[int], limit: int) -> tuple[list[int], torch.Tensor | None]:
        feed, self.pending = [*self.pending, tokens[-1]], []
        count = min(self.count, limit)
        if count < 1:  # nothing to draft: the tokens wait for the next step
            self.pending = feed
            return [], None
        for token in feed:
            logits = self._step(token)
        drafts, rows = [], []
        while True:
            scores = self.processing(logits)  # [1, vocab]
            draft = int(next_tokens(scores, self.do_sample, self.generator)[0])
            drafts.append(draft)
            rows.append(scores)
            if len(drafts) == count or (
                self.threshold > 0 and float(scores[0].float().softmax(dim=-1)[draft]) < self.threshold
            ):
                break
            logits = self._step(draft)
        return drafts, torch.cat(rows) if self.do_sample else None  # [drafts, vocab]

    def accepted(self, drafts: list[int], taken: int) -> None:
        if drafts and taken == len(drafts):
            self.pending = [drafts[-1]]  # drafted, never fed: stored next step, before the model's token
        else:  # back to the slot after the last kept draft: the rejected ones there are overwritten in turn
            self.session.cache_position.sub_(len(drafts) - taken - 1)
            self.session.position_ids.sub_(len(drafts) - taken - 1)
        if self.adaptive and drafts:
            self.count = min(self.width, self.count + 2) if taken == len(drafts) else max(1, self.count - 1)

    def _step(self, token: int) -> torch.Tensor:
        """Feed `token` at the draft's cursor and move it on; the draft's logits `[1, vocab]` for what follows."""
        session = self.session
        position_ids = session.position_ids
        if self.last_position is not None:  # a draft past its position table is only a bad guess, never kept
            position_ids = position_ids.clamp(max=self.last_position)
        logits = session.forward(
            torch.tensor([[token]], device=position_ids.device),
            attention_mask=self.padding,
            position_ids=position_ids,
            past_key_values=session.cache,
            cache_position=session.cache_position,
        ).logits[:, -1]
        session.cache_position.add_(1)
        session.position_ids.add_(1)
        return logits
