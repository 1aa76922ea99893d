"""Prompt-lookup decoding (upstream's `prompt_lookup_num_tokens`) on the static path: draft tokens copied from an
earlier occurrence of the text's last n-gram, checked by the model in one verify forward of fixed width K+1.

A verify step writes `[last token, K drafts]` to cache slots `cur..cur+K` and reads the logits of all K+1. The model
turns the 2D padding mask (at the cache's full length) and `cache_position` into its static 4D mask, as a prefill
chunk does: drafts are causal among themselves and over the cache, and the slots of rejected drafts (past the
accepted length) are hidden by causality until the next verify overwrites them. Every verify has the same shapes
(`[1, K+1]`, drafts padded when fewer are found), so a compiled forward sees one verify graph besides the prefill
chunk's. Greedy only: a draft is accepted while it equals the model's own argmax, so the output is plain greedy's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .configuration_utils import GenerationConfig
from .logits_process import LogitsProcessing

if TYPE_CHECKING:
    from .utils import _Session

DEFAULT_MAX_MATCHING_NGRAM_SIZE = 2  # upstream's


def verify_room(config: GenerationConfig) -> int:
    """Cache slots a verify step may write past the last new token (its drafts)."""
    return config.prompt_lookup_num_tokens or 0


def lookup_candidates(tokens: list[int], num_tokens: int, max_ngram: int) -> list[int]:
    """Up to `num_tokens` tokens that followed the leftmost earlier occurrence of the text's last n-gram (longest
    n first, `max_ngram` down to 1), as upstream's PromptLookupCandidateGenerator picks them; [] when none."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(length - n):
            if tokens[start : start + n] == tail and start + n < length:
                return tokens[start + n : min(start + n + num_tokens, length)]
    return []


def check_prompt_lookup(config: GenerationConfig, batch: int, streaming: bool) -> None:
    """What prompt-lookup decoding here does not combine with, refused naming the field."""
    if config.num_beams > 1:
        raise NotImplementedError("generate does not support num_beams > 1 with prompt_lookup_num_tokens")
    if batch != 1:
        raise ValueError(f"prompt-lookup decoding is only supported for batch_size = 1 (got {batch}), as upstream")
    if config.prompt_lookup_num_tokens < 1 or (
        config.max_matching_ngram_size is not None and config.max_matching_ngram_size < 1
    ):
        raise ValueError("prompt_lookup_num_tokens and max_matching_ngram_size must be >= 1")
    if config.do_sample:
        raise NotImplementedError("generate does not support do_sample=True with prompt_lookup_num_tokens (sampling)")
    if config.cache_implementation == "dynamic":
        raise NotImplementedError(
            "generate does not support cache_implementation='dynamic' with prompt_lookup_num_tokens: the verify step "
            "runs on the static cache"
        )
    refused = {
        "stop_strings": config.stop_strings is not None,
        "max_time": config.max_time is not None,
        "output_scores": bool(config.return_dict_in_generate and config.output_scores),
        "output_logits": bool(config.return_dict_in_generate and config.output_logits),
        "streamer": streaming,
    }
    if names := [name for name, asked in refused.items() if asked]:
        raise NotImplementedError(f"generate does not support {', '.join(names)} with prompt_lookup_num_tokens")


def prompt_lookup(
    model: Any,
    session: _Session,
    logits: torch.Tensor,
    config: GenerationConfig,
    processing: LogitsProcessing,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """`generate`'s decode for prompt-lookup decoding: the new tokens `[1, new]` (no scores or logits kept)."""
    if processing.processors:
        raise NotImplementedError(
            "generate does not support logits processors (repetition penalties, min length, suppressed tokens, ...) "
            "with prompt_lookup_num_tokens"
        )
    if session.cache.ring_windows and config.prompt_lookup_num_tokens + 1 > config.prefill_chunk:
        raise ValueError(
            f"prompt_lookup_num_tokens ({config.prompt_lookup_num_tokens}) + 1 must be <= prefill_chunk_size "
            f"({config.prefill_chunk}) on a model with sliding-window ring caches (a verify step must fit the ring)"
        )
    prompt = input_ids[0][attention_mask[0].bool()].tolist()
    new_tokens, _ = prompt_lookup_decode(model, session, logits, config, prompt, max_new_tokens)
    return new_tokens, [], []


def prompt_lookup_decode(
    model: Any,
    session: _Session,
    logits: torch.Tensor,
    config: GenerationConfig,
    prompt: list[int],
    max_new_tokens: int,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Greedy decoding of one row from the prefill's `logits` `[1, vocab]`, `prompt` its real tokens; returns the new
    tokens `[1, new]` (ending at the first EOS) and counts: verify steps, drafts proposed and accepted."""
    width = config.prompt_lookup_num_tokens
    max_ngram = config.max_matching_ngram_size or DEFAULT_MAX_MATCHING_NGRAM_SIZE
    eos = set(config.eos_token_ids)
    device = logits.device
    # The 2D padding mask at full length: the prompt's padding, then real slots (causality hides the unwritten).
    padding = torch.ones(1, session.capacity, dtype=torch.bool, device=device)
    padding[:, : session.prompt_mask.shape[1]] = session.prompt_mask.bool()
    offsets = torch.arange(width + 1, device=device)
    # draft positions past a position table are never kept: clamped, never indexed past it
    last_position = model.max_positions - 1 if model.max_positions is not None else torch.iinfo(torch.long).max
    new = [int(logits[0].argmax())]
    stats = {"verify_steps": 0, "drafted": 0, "accepted": 0}
    while len(new) < max_new_tokens and new[-1] not in eos:
        drafts = lookup_candidates(prompt + new, width, max_ngram)[: max_new_tokens - len(new)]
        fed = torch.tensor([[new[-1], *drafts] + [new[-1]] * (width - len(drafts))], device=device)  # [1, K+1]
        cache_position = session.cache_position + offsets  # [K+1]
        position_ids = (session.position_ids + offsets).clamp(max=last_position)  # [1, K+1]
        predicted = model_verify(session, fed, padding, position_ids, cache_position).tolist()  # [K+1]
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == predicted[accepted] and drafts[accepted] not in eos:
            accepted += 1
        new += predicted[: accepted + 1][: max_new_tokens - len(new)]
        stats["verify_steps"] += 1
        stats["drafted"] += len(drafts)
        stats["accepted"] += accepted
        session.cache_position.add_(accepted + 1)
        session.position_ids.add_(accepted + 1)
    if eos & set(new):
        new = new[: next(i for i, t in enumerate(new) if t in eos) + 1]
    return torch.tensor([new], device=device), stats


def model_verify(
    session: _Session,
    fed: torch.Tensor,
    padding: torch.Tensor,
    position_ids: torch.Tensor,
    cache_position: torch.Tensor,
) -> torch.Tensor:
    """One verify forward of `fed` `[1, K+1]` at `cache_position` `[K+1]`: the model's argmax at each `[K+1]`."""
    logits = session.forward(
        fed,
        attention_mask=padding,
        position_ids=position_ids,
        past_key_values=session.cache,
        cache_position=cache_position,
    ).logits  # [1, K+1, vocab]
    return logits[0].argmax(dim=-1)
