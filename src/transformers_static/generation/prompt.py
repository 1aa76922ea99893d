"""The prompt generate decodes from: checked against the vocabulary, padding mask validated, moved to left padding."""

from __future__ import annotations

import torch

from ..modeling_inputs import check_token_ids
from .configuration_utils import GenerationConfig, warn_once


def prepare_prompt(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, vocab_size: int, config: GenerationConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, mask)` `[batch, prompt_len]`, left-padded: each row's tokens are one run (a mask with holes is an
    error); a run that does not end at the last column (right padding) is moved there, with a one-time warning.
    Real tokens must lie in `[0, vocab_size)`. Without a mask, padding is where input_ids hold `pad_token_id`, when it
    is set and is not an EOS (upstream's rule)."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be 2D [batch, prompt_len] with prompt_len >= 1, got {list(input_ids.shape)}")
    pad = config.pad_token_id
    inferred = attention_mask is None and pad is not None and pad not in config.eos_token_ids
    if attention_mask is None:
        attention_mask = (input_ids != pad).long() if inferred else torch.ones_like(input_ids)
    elif attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of input_ids {list(input_ids.shape)} [batch, prompt_len], "
            f"got {list(attention_mask.shape)}"
        )
    mask = attention_mask.long()
    check_token_ids(input_ids, vocab_size, real=mask)
    hint = f" (no attention_mask given: padding inferred where input_ids == pad_token_id {pad})" if inferred else ""
    trailing = _trailing_padding(mask, hint)  # [batch]
    if bool(trailing.any()):
        warn_once(
            "Right padding detected in a batch for a decoder-only model: generate moved each row's padding to the "
            "left (the tokens are those of the same batch left-padded; the returned prompt is left-padded)"
        )
        width = input_ids.shape[1]
        source = (torch.arange(width, device=mask.device) - trailing[:, None]) % width  # [batch, prompt_len]
        input_ids, mask = input_ids.gather(1, source), mask.gather(1, source)
    return input_ids, mask


def _trailing_padding(mask: torch.Tensor, hint: str) -> torch.Tensor:
    """Padding columns after each row's last token `[batch]`; a ValueError for rows with no token or with holes."""
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
    counts = mask.sum(-1)
    width = mask.shape[1]
    first = mask.argmax(-1)
    end = width - mask.flip(-1).argmax(-1)  # one past each row's last token
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"attention_mask rows {empty} have no token (all padding){hint}")
    holes = (end - first != counts).nonzero().flatten().tolist()
    if holes:
        raise ValueError(
            f"attention_mask rows {holes} have padding between tokens{hint}; a row's tokens must be contiguous "
            "(left padding, or right padding which generate moves to the left)"
        )
    return width - end
