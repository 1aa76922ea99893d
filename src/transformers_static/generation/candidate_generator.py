"""Candidate decoding on the static path: prompt lookup (upstream's `prompt_lookup_num_tokens`) and assisted decoding
(`assistant_model`, see `assisted_decoding`) draft tokens that the model checks in one verify forward of fixed width
K+1.

A verify step writes `[last token, K drafts]` to cache slots `cur..cur+K` and reads the logits of all K+1. The model
turns the 2D padding mask (at the cache's full length) and `cache_position` into its static 4D mask, as a prefill
chunk does: drafts are causal among themselves and over the cache, and the slots of rejected drafts (past the
accepted length) are hidden by causality until a later step overwrites them. Every verify has the same shapes
(`[1, K+1]`, drafts padded when fewer are proposed), so a compiled forward sees one verify graph besides the prefill
chunk's.

Acceptance follows upstream: greedy keeps drafts while they equal the model's argmax (the output is plain greedy's);
sampling without draft probabilities (prompt lookup) keeps them while they equal the model's own samples; sampling
with a draft model's probabilities applies speculative sampling (`speculative_accept`), so every output token is
distributed exactly as the model's own sample would be.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from ..cache_utils import recurrent_state_specs
from ..configuration_utils import PretrainedConfig
from .configuration_utils import GenerationConfig
from .logits_process import LogitsProcessing, next_tokens

if TYPE_CHECKING:
    from .utils import Streamer, _Session

DEFAULT_MAX_MATCHING_NGRAM_SIZE = 2  # upstream's


class CandidateSource(Protocol):
    """Where drafts come from: a prompt lookup, or a draft model. Rows are a batch's sequences."""

    def propose(self, texts: list[list[int]], limits: list[int]) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Per row, up to `limits[i]` drafts continuing `texts[i]` (the text so far, its last token not yet in the
        cache), and the draft's processed scores `[len(drafts), vocab]` when it has probabilities (else None)."""
        ...

    def accepted(self, drafts: list[list[int]], taken: list[int]) -> None:
        """Per row, the verify step kept the first `taken[i]` of `drafts[i]` (then the model's own next token)."""
        ...


@dataclass
class CandidateDecoding:
    """What a candidate decode returns: the new tokens `[batch, new]`, per new token (batch 1, when asked) the
    processed scores and raw logits `[1, vocab]` (float32), and counts: verify steps, drafts proposed and kept."""

    tokens: torch.Tensor
    scores: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=lambda: {"verify_steps": 0, "drafted": 0, "accepted": 0})


@dataclass
class Cursor:
    """Where each row writes next: `slots` `[batch]` (its cache slot) and `positions` `[batch]` (its token's
    position). One row shares `cache_position` `[q_len]` (the contract every cache takes, rings included); several
    rows, each at its own length after different numbers of kept drafts, pass `[batch, q_len]` (per-row slots)."""

    slots: torch.Tensor
    positions: torch.Tensor
    last_position: int  # positions past a position table are clamped (such drafts are never kept)

    @classmethod
    def of(cls, session: _Session, max_model_position: int | None) -> Cursor:
        batch = session.position_ids.shape[0]
        last = torch.iinfo(torch.long).max if max_model_position is None else max_model_position - 1
        return cls(session.cache_position.expand(batch).clone(), session.position_ids[:, -1].clone(), last)

    def inputs(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`cache_position` (`[width]` for one row, else `[batch, width]`) and `position_ids` `[batch, width]` of
        `width` tokens from the cursor."""
        offsets = torch.arange(width, device=self.slots.device)
        cache_position = self.slots[:, None] + offsets  # [batch, width]
        position_ids = (self.positions[:, None] + offsets).clamp(max=self.last_position)
        return (cache_position[0] if cache_position.shape[0] == 1 else cache_position), position_ids

    def advance(self, steps: list[int]) -> None:
        """Move row i on by `steps[i]` slots (negative: back)."""
        moved = torch.tensor(steps, device=self.slots.device)
        self.slots += moved
        self.positions += moved


def verify_width(config: GenerationConfig) -> int:
    """Drafts per verify step (the cache slots a step may write past the last new token); 0 without candidates."""
    return config.prompt_lookup_num_tokens or config.num_assistant_tokens or 0


class PromptLookup:
    """Drafts copied from the text: what followed the leftmost earlier occurrence of its last n-gram."""

    def __init__(self, config: GenerationConfig) -> None:
        self.width = config.prompt_lookup_num_tokens
        self.max_ngram = config.max_matching_ngram_size or DEFAULT_MAX_MATCHING_NGRAM_SIZE

    def propose(self, texts: list[list[int]], limits: list[int]) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        drafts = [
            lookup_candidates(text, min(self.width, limit), self.max_ngram)
            for text, limit in zip(texts, limits, strict=True)
        ]
        return drafts, [None] * len(texts)

    def accepted(self, drafts: list[list[int]], taken: list[int]) -> None:
        pass


def lookup_candidates(tokens: list[int], num_tokens: int, max_ngram: int) -> list[int]:
    """Up to `num_tokens` tokens that followed the leftmost earlier occurrence of the text's last n-gram (longest
    n first, `max_ngram` down to 1), as upstream's PromptLookupCandidateGenerator picks them; [] when none."""
    length = len(tokens)
    if num_tokens < 1:
        return []
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(length - n):
            if tokens[start : start + n] == tail and start + n < length:
                return tokens[start + n : min(start + n + num_tokens, length)]
    return []


def check_rewindable(model_config: PretrainedConfig, name: str) -> None:
    """A verify step drops rejected drafts by writing over their cache slots; a recurrent layer's state has already
    taken them in (recurrent_utils), so a model with recurrent layers cannot verify drafts, nor be the draft model."""
    recurrent = [i for i, specs in enumerate(recurrent_state_specs(model_config)) if specs]
    if recurrent:
        raise NotImplementedError(
            f"generate does not support {name} with a {model_config.model_type} model: its recurrent layers "
            f"{recurrent} keep a state that rejected draft tokens cannot be taken back out of"
        )


def check_candidates(config: GenerationConfig, batch: int, streaming: bool, assisted: bool) -> None:
    """What candidate decoding here does not combine with, refused naming the field."""
    name = "assistant_model" if assisted else "prompt_lookup_num_tokens"
    if assisted and config.prompt_lookup_num_tokens is not None:
        raise ValueError("assistant_model and prompt_lookup_num_tokens are two candidate generators: choose one")
    if config.num_beams > 1:
        raise NotImplementedError(f"generate does not support num_beams > 1 with {name}")
    if batch > 1:  # rows keep different numbers of tokens per step: no per-step outputs to line up
        refused = {
            "output_scores": bool(config.return_dict_in_generate and config.output_scores),
            "output_logits": bool(config.return_dict_in_generate and config.output_logits),
            "streamer": streaming,
        }
        if names := [field_name for field_name, asked in refused.items() if asked]:
            raise NotImplementedError(f"generate does not support {', '.join(names)} with {name} at batch size > 1")
    if not assisted and (
        config.prompt_lookup_num_tokens < 1
        or (config.max_matching_ngram_size is not None and config.max_matching_ngram_size < 1)
    ):
        raise ValueError("prompt_lookup_num_tokens and max_matching_ngram_size must be >= 1")
    if config.cache_implementation == "dynamic":
        raise NotImplementedError(
            f"generate does not support cache_implementation='dynamic' with {name}: the verify step runs on the "
            "static cache"
        )
    if config.stop_strings is not None:
        raise NotImplementedError(f"generate does not support stop_strings with {name}")
    for field_name, what in (("assistant_ensemble_weight", "ensemble verification"), ("speculation_type", "DFlash")):
        if getattr(config, field_name) is not None:
            raise NotImplementedError(f"generate does not support {field_name} ({what}) with {name}")


def check_processing(processing: LogitsProcessing, name: str) -> None:
    """Processors that read the token history cannot score K+1 positions at once: refused."""
    if not processing.stateless:
        raise NotImplementedError(
            "generate does not support logits processors (repetition penalties, min length, suppressed tokens, ...) "
            f"with {name}; the sampling warpers (temperature, top_k, top_p, ...) are supported"
        )


def candidate_decode(
    session: _Session,
    logits: torch.Tensor,
    config: GenerationConfig,
    processing: LogitsProcessing,
    source: CandidateSource,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    deadline: float | None = None,
    max_model_position: int | None = None,
) -> CandidateDecoding:
    """Decode from the prefill's `logits` `[batch, vocab]` (`prompts`: each row's real tokens) with drafts from
    `source` checked by verify steps `[batch, K+1]`; a row ends at its first EOS or `max_new_tokens`, all at the
    `deadline` (`time.monotonic()`, checked between steps, as upstream checks max_time). A finished row's verify
    inputs are its last token again, written at its cursor and never kept. Rows shorter than the longest are padded
    with `pad_token_id` (the first EOS when unset, as upstream)."""
    batch = logits.shape[0]
    width = verify_width(config)
    eos = set(config.eos_token_ids)
    device = logits.device
    # The 2D padding mask at full length: the prompt's padding, then real slots (causality hides the unwritten).
    padding = torch.ones(batch, session.capacity, dtype=torch.bool, device=device)
    padding[:, : session.prompt_mask.shape[1]] = session.prompt_mask.bool()
    cursor = Cursor.of(session, max_model_position)
    record = Recorder(config, streamer)
    scores = processing(logits)  # [batch, vocab]
    news = [[token] for token in next_tokens(scores, config.do_sample, generator).tolist()]
    record(news[0], scores, logits)
    result = CandidateDecoding(torch.empty(0), record.scores, record.logits)
    while True:
        live = [len(new) < max_new_tokens and new[-1] not in eos for new in news]
        if not any(live) or (deadline is not None and time.monotonic() > deadline):
            break
        limits = [max_new_tokens - len(new) - 1 if on else 0 for new, on in zip(news, live, strict=True)]
        drafts, draft_scores = source.propose([p + new for p, new in zip(prompts, news, strict=True)], limits)
        fed = [[new[-1], *d] + [new[-1]] * (width - len(d)) for new, d in zip(news, drafts, strict=True)]
        cache_position, position_ids = cursor.inputs(width + 1)
        verify_logits = session.forward(
            torch.tensor(fed, device=device),  # [batch, K+1]
            attention_mask=padding,
            position_ids=position_ids,
            past_key_values=session.cache,
            cache_position=cache_position,
        ).logits  # [batch, K+1, vocab]
        # the warpers work row by row: every row's K+1 positions as one batch
        verify_scores = processing(verify_logits.flatten(0, 1)).unflatten(0, (batch, width + 1))
        taken, moved = [0] * batch, [0] * batch
        for row in (row for row in range(batch) if live[row]):
            kept_drafts, bonus = accept(
                drafts[row], draft_scores[row], verify_scores[row], config.do_sample, generator
            )
            kept = (drafts[row][:kept_drafts] + [bonus])[: max_new_tokens - len(news[row])]
            if eos & set(kept):
                kept = kept[: next(i for i, t in enumerate(kept) if t in eos) + 1]
            taken[row], moved[row] = min(kept_drafts, len(kept)), len(kept)
            news[row] += kept
            record(kept, verify_scores[row, : len(kept)], verify_logits[row, : len(kept)])
        source.accepted(drafts, taken)
        result.stats["verify_steps"] += 1
        result.stats["drafted"] += sum(map(len, drafts))
        result.stats["accepted"] += sum(taken)
        # each row's cache now holds its last token and its kept drafts; its next step starts at the model's token
        cursor.advance(moved)
    pad = config.pad_token_id if config.pad_token_id is not None else next(iter(config.eos_token_ids), 0)
    longest = max(map(len, news))
    result.tokens = torch.tensor([new + [pad] * (longest - len(new)) for new in news], device=device)
    return result


class Recorder:
    """Per kept token of one row (batch 1: checked by `check_candidates`), its processed scores and raw logits
    `[1, vocab]` when asked, and the kept tokens to the streamer."""

    def __init__(self, config: GenerationConfig, streamer: Streamer | None) -> None:
        self.keep_scores = bool(config.return_dict_in_generate and config.output_scores)
        self.keep_logits = bool(config.return_dict_in_generate and config.output_logits)
        self.streamer = streamer
        self.scores: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []

    def __call__(self, kept: list[int], scores: torch.Tensor, logits: torch.Tensor) -> None:
        """`kept` tokens, their `[len(kept), vocab]` processed scores and raw logits."""
        # copies, in float32: a CUDA-graph output is overwritten by the next replay
        if self.keep_scores:
            self.scores += [row[None].to(torch.float32, copy=True) for row in scores]
        if self.keep_logits:
            self.logits += [row[None].to(torch.float32, copy=True) for row in logits]
        if self.streamer is not None:
            self.streamer.put(torch.tensor(kept))


def accept(
    drafts: list[int],
    draft_scores: torch.Tensor | None,
    scores: torch.Tensor,
    do_sample: bool,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """How many drafts a verify step keeps, and the model's own token after them. `scores` `[K+1, vocab]`: the
    model's processed scores at each fed position; `draft_scores` `[len(drafts), vocab]` or None."""
    if do_sample and draft_scores is not None and drafts:
        return speculative_accept(drafts, draft_scores, scores, generator)
    picked = next_tokens(scores[: len(drafts) + 1], do_sample, generator).tolist()  # [len(drafts) + 1]
    taken = 0
    while taken < len(drafts) and drafts[taken] == picked[taken]:
        taken += 1
    return taken, picked[taken]


def speculative_accept(
    drafts: list[int], draft_scores: torch.Tensor, scores: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023, algorithm 1, as upstream's `_speculative_sampling`): keep draft
    i with probability min(1, p_i / q_i) until the first rejection, then sample from the normalised residual
    max(p - q, 0) there (or from p after the last draft). Each kept token is distributed as a sample from p."""
    k = len(drafts)
    p = scores[: k + 1].float().softmax(dim=-1)  # [k+1, vocab]: the model
    q = draft_scores.float().softmax(dim=-1)  # [k, vocab]: the draft
    index = torch.arange(k, device=p.device)
    drafted = torch.tensor(drafts, device=p.device)
    ratio = p[index, drafted] / q[index, drafted]  # [k]
    uniform = torch.rand(k, generator=generator, device=p.device)
    taken = int((uniform > ratio).long().cumsum(0).eq(0).sum())
    target = p[taken]
    if taken < k:
        residual = (p[taken] - q[taken]).clamp(min=0)
        # a rejection means p < q at the draft, so the residual has mass; rounding could still leave none
        target = residual / residual.sum() if bool(residual.sum() > 0) else p[taken]
    return taken, int(torch.multinomial(target, 1, generator=generator))
