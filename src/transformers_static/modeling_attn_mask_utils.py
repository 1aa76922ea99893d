"""AttentionMaskConverter: the one place attention masks are made.

A mask is the conjunction of small predicates over `(batch, q_idx, kv_idx)`, where `q_idx` is the absolute
position of a query (its `cache_position`) and `kv_idx` a key slot:

    causal:          kv_idx <= q_idx
    sliding window:  kv_idx >  q_idx - W          (W keys, the query's own included)
    padding:         padding_mask[batch, kv_idx]  (1 = real token)

materialised once per forward by broadcasting index ranges into a bool tensor `[batch, 1, q_len, kv_len]`
(True = may attend). For q_len=3 at cache positions 2..4, kv_len=6, W=2, first key padded:

    kv_idx:  0 1 2 3 4 5
    q=2      ⬚ ■ ■ ⬚ ⬚ ⬚
    q=3      ⬚ ⬚ ■ ■ ⬚ ⬚
    q=4      ⬚ ⬚ ⬚ ■ ■ ⬚

A user's 4D mask (bool, or additive float: 0 = attend, large negative = masked) is validated and used as given.

`AttentionMaskConverter` is stateless: models keep one per mask kind and call it once per forward. The
static-buffer path is `StaticDecodeMask`, which one `generate` call owns: it allocates the decode mask
`[batch, 1, 1, max_cache_len]` once and updates it in place before each decode step (it opens the new token's slot
and, with a window, closes the slot that left it: O(batch) writes, no allocation, no host sync).
"""

from __future__ import annotations

from typing import Any

import torch

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


class AttentionMaskConverter:
    """Builds and validates 4D attention masks for one kind of attention (full causal, or a sliding window)."""

    def __init__(self, sliding_window: int | None = None) -> None:
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive number of keys, got {sliding_window}")
        self.sliding_window = sliding_window

    def to_4d(
        self,
        attention_mask: torch.Tensor | None,
        *,
        batch_size: int,
        q_len: int,
        kv_len: int,
        cache_position: torch.Tensor,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The mask attention takes, `[batch, 1, q_len, kv_len]`, from None, a 2D padding mask or a 4D mask.

        `kv_len` is the key length attention sees: the static cache capacity, or past + q_len without one.
        A 2D mask may be shorter than `kv_len` (a static cache not yet full): the missing slots lie in the future
        of every query and stay masked by causality. An additive 4D mask is cast to `dtype` (the model's).
        """
        if attention_mask is not None and attention_mask.dim() == 4:
            return self._check_4d(attention_mask, batch_size=batch_size, q_len=q_len, kv_len=kv_len, dtype=dtype)
        padding = None
        if attention_mask is not None:
            padding = self._check_2d(attention_mask, batch_size=batch_size, q_len=q_len, kv_len=kv_len)
        mask = self._causal(cache_position, kv_len)  # [q_len, kv_len]
        if padding is None:
            return mask[None, None].expand(batch_size, 1, q_len, kv_len)
        return mask[None, None] & padding[:, None, None, :]

    @staticmethod
    def with_bias(mask: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Fold a score bias (ALiBi) into a mask: additive `[batch, heads, q_len, kv_len]`, `bias` where the mask
        allows and the dtype's lowest value where it does not (finite, so no row can become NaN)."""
        lowest = torch.finfo(dtype).min
        if mask.dtype == torch.bool:
            return bias.to(dtype).masked_fill(~mask, lowest)
        return (mask.to(dtype) + bias.to(dtype)).clamp(min=lowest)

    def _causal(self, cache_position: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Causal (and windowed) bool mask `[q_len, kv_len]` for queries at `cache_position`."""
        kv_idx = torch.arange(kv_len, device=cache_position.device)[None, :]
        q_idx = cache_position[:, None]
        mask = kv_idx <= q_idx
        if self.sliding_window is not None:
            mask = mask & (kv_idx > q_idx - self.sliding_window)
        return mask

    @staticmethod
    def _check_2d(attention_mask: torch.Tensor, *, batch_size: int, q_len: int, kv_len: int) -> torch.Tensor:
        """Validate a 2D padding mask and return it as bool `[batch, kv_len]`."""
        if attention_mask.dim() != 2:
            raise ValueError(
                f"attention_mask must be 2D [batch, kv_len] or 4D [batch, 1, q_len, kv_len], "
                f"got {attention_mask.dim()}D with shape {tuple(attention_mask.shape)}"
            )
        mask_batch, mask_len = attention_mask.shape
        if mask_batch != batch_size or not q_len <= mask_len <= kv_len:
            raise ValueError(
                f"2D attention_mask must have shape [{batch_size}, L] with {q_len} <= L <= {kv_len} "
                f"(batch, past + q_len up to the cache length), got {tuple(attention_mask.shape)}"
            )
        padding = attention_mask.bool()
        if mask_len < kv_len:
            padding = torch.nn.functional.pad(padding, (0, kv_len - mask_len), value=True)
        return padding

    @staticmethod
    def _check_4d(
        attention_mask: torch.Tensor, *, batch_size: int, q_len: int, kv_len: int, dtype: torch.dtype | None
    ) -> torch.Tensor:
        """Validate a user's 4D mask; additive masks are clamped so no row can turn into NaN."""
        expected = (batch_size, 1, q_len, kv_len)
        shape = tuple(attention_mask.shape)
        if shape[0] not in (1, batch_size) or shape[1:] != expected[1:]:
            raise ValueError(
                f"4D attention_mask must have shape {list(expected)} [batch, 1, q_len, kv_len], where kv_len is "
                f"the key length attention sees (the static cache's max_cache_len, or past + q_len), got {list(shape)}"
            )
        if attention_mask.dtype == torch.bool:
            return attention_mask
        if not attention_mask.is_floating_point():
            raise ValueError(
                f"4D attention_mask must be bool (True = attend) or floating additive (0 = attend), "
                f"got dtype {attention_mask.dtype}"
            )
        attention_mask = attention_mask.to(dtype or attention_mask.dtype)
        return attention_mask.clamp(min=torch.finfo(attention_mask.dtype).min)


def attention_type(config: Any, layer_idx: int) -> str:
    """The mask kind of one layer: `config.layer_types[layer_idx]` where the config lists them, else sliding for
    every layer when the config has a `sliding_window`, else full causal."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return layer_types[layer_idx]
    return SLIDING_ATTENTION if getattr(config, "sliding_window", None) else FULL_ATTENTION


def mask_converters(config: Any) -> dict[str, AttentionMaskConverter]:
    """One converter per mask kind the model's layers use (so each kind's mask is made once per forward)."""
    kinds = {attention_type(config, i) for i in range(config.num_hidden_layers)}
    windows = {FULL_ATTENTION: None, SLIDING_ATTENTION: getattr(config, "sliding_window", None)}
    return {kind: AttentionMaskConverter(sliding_window=windows[kind]) for kind in sorted(kinds)}


def position_ids_from_padding(padding_mask: torch.Tensor, cache_position: torch.Tensor | None = None) -> torch.Tensor:
    """Positions from a 2D padding mask `[batch, kv_len]` (1 = real token): the count of real tokens before each
    slot, so left-padded rows start at 0 (padding slots get 0). Returns `[batch, kv_len]`, or `[batch, q_len]`
    for the queries at `cache_position` `[q_len]` (which must lie inside the mask)."""
    positions = (padding_mask.long().cumsum(-1) - 1).clamp(min=0)  # [batch, kv_len]
    return positions if cache_position is None else positions[:, cache_position]


class StaticDecodeMask:
    """The decode-step mask of one kind for one `generate` call on a StaticCache: `[batch, 1, 1, max_cache_len]`,
    allocated once, then moved forward one slot in place per step (so a compiled decode step always reads the same
    tensor, and nothing is allocated or read back on the host)."""

    def __init__(
        self, converter: AttentionMaskConverter, padding_mask: torch.Tensor, cache_position: torch.Tensor
    ) -> None:
        """`padding_mask` `[batch, max_cache_len]` (1 = real token; slots not yet written 1); `cache_position`
        `[1]` the slot of the last token already in the cache: the buffer starts as that token's mask row."""
        batch_size, max_cache_len = padding_mask.shape
        self.sliding_window = converter.sliding_window
        self.mask = converter.to_4d(
            padding_mask, batch_size=batch_size, q_len=1, kv_len=max_cache_len, cache_position=cache_position
        ).clone()  # [batch, 1, 1, max_cache_len]
        self.leaving = torch.empty_like(cache_position)  # [1], the slot leaving the window (sliding kinds)

    def advance(self, cache_position: torch.Tensor) -> torch.Tensor:
        """Open slot `cache_position` `[1]` in place (and close the one leaving the window); returns the mask."""
        max_cache_len = self.mask.shape[-1]
        self.mask.index_fill_(-1, cache_position, True)
        if self.sliding_window is not None and self.sliding_window < max_cache_len:
            # Before the window is full, (pos - W) wraps to a slot in the future, which is still closed.
            torch.sub(cache_position, self.sliding_window, out=self.leaving).remainder_(max_cache_len)
            self.mask.index_fill_(-1, self.leaving, False)
        return self.mask
