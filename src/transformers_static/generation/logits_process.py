"""Next-token choice: temperature, top-k and top-p filtering, then greedy or sampled picks without a host sync."""

from __future__ import annotations

import torch

from .configuration_utils import GenerationConfig


def filter_logits(logits: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """Apply temperature, top-k, top-p (in that order, as upstream) to float32 logits `[batch, vocab]`."""
    logits = logits / config.temperature
    if config.top_k is not None and 0 < config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[:, -1:]  # [batch, 1]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if config.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= 1 - config.top_p
        remove[:, -1] = False  # always keep the most likely token
        logits = logits.masked_fill(remove.scatter(1, sorted_idx, remove), -float("inf"))
    return logits


def next_tokens(
    logits: torch.Tensor, config: GenerationConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """`[batch]` token ids from the last-position logits `[batch, vocab]`."""
    if not config.do_sample:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits.float(), config).softmax(dim=-1)
    # Exponential race (argmax of p / E, E ~ Exp(1)) samples from probs with no host sync.
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)
