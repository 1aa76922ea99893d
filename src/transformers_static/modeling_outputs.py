"""Model outputs: dataclasses read by attribute (`out.logits`), as upstream's are."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache_utils import Cache


@dataclass
class BaseModelOutputWithPast:
    last_hidden_state: torch.Tensor  # [batch, q_len, hidden]
    past_key_values: Cache | None = None


@dataclass
class CausalLMOutputWithPast:
    logits: torch.Tensor  # [batch, q_len, vocab]
    past_key_values: Cache | None = None
    loss: torch.Tensor | None = None
