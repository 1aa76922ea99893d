"""AttentionMaskConverter: the one place attention masks are made.

A mask is the conjunction of small predicates over `(batch, q_idx, kv_idx)`, where `q_idx` is the absolute
position of a query (its `cache_position`) and `kv_idx` a key slot:

    causal:          kv_idx <= q_idx
    sliding window:  kv_idx >  q_idx - W          (W keys, the query's own included)
    padding:         padding_mask[batch, kv_idx]  (1 = real token)

`q_idx` is shared by the rows (`cache_position` `[q_len]`) or per row (`[batch, q_len]`: a server's rows, each a
request at its own length; a key is then visible to a row's query iff it is in that row's padding mask, at or
before the query's slot, and inside the window). For rows at slots 3 and 1 (kv_len=5, no padding):

    kv_idx:  0 1 2 3 4
    row 0    ■ ■ ■ ■ ⬚
    row 1    ■ ■ ⬚ ⬚ ⬚

materialised once per forward by broadcasting index ranges into a bool tensor `[batch, 1, q_len, kv_len]`
(True = may attend). For q_len=3 at cache positions 2..4, kv_len=6, W=2, first key padded:

    kv_idx:  0 1 2 3 4 5
    q=2      ⬚ ■ ■ ⬚ ⬚ ⬚
    q=3      ⬚ ⬚ ■ ■ ⬚ ⬚
    q=4      ⬚ ⬚ ⬚ ■ ■ ⬚

A user's 4D mask (bool, or additive float: 0 = attend, large negative = masked) is validated and used as given.

A sliding-window layer's StaticCache slots are a ring (cache_utils.StaticCache): slot j holds the key of cache
position `key_cache_positions[j]` (-1: never written). Its mask is the same predicates with `kv_idx` read from
there, never-written slots masked; a 2D mask, or a user's 4D mask over cache positions `[.., max_cache_len]`, is
read at each slot's position. For a ring of 4 slots holding positions 4, 5, 2, 3 and a query at 5, W=3:

    slot:      0 1 2 3
    position:  4 5 2 3
    q=5        ■ ■ ⬚ ■

`AttentionMaskConverter` is stateless: models keep one per mask kind and call it once per forward. The
static-buffer path is `StaticDecodeMask`, which one `generate` call owns: it allocates the decode mask
`[batch, 1, 1, slots]` once and updates it in place before each decode step (it opens the new token's slot
and, with a window, closes the slot that left it: O(batch) writes, no allocation, no host sync).
"""

from __future__ import annotations

from typing import Any

import torch

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LINEAR_ATTENTION = "linear_attention"  # a recurrent layer (gated delta-net): reads the full causal mask


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
        key_cache_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The mask attention takes, `[batch, 1, q_len, kv_len]`, from None, a 2D padding mask or a 4D mask.

        `kv_len` is the key length attention sees: the static cache capacity, or past + q_len without one.
        A 2D mask may be shorter than `kv_len` (a static cache not yet full): the missing slots lie in the future
        of every query and stay masked by causality. An additive 4D mask is cast to `dtype` (the model's).

        `cache_position` is `[q_len]`, or `[batch, q_len]` for per-row slots (full-length keys only).
        `key_cache_positions` `[keys]`: the keys are a ring's (a sliding-window layer's StaticCache slots), key j
        holding cache position `key_cache_positions[j]` (-1: none). The mask is then `[batch, 1, q_len, keys]`:
        the predicates over those positions, keys holding none masked; a 2D mask, or a 4D mask over cache positions
        (`kv_len` wide), is read at each key's position; a 4D mask `keys` wide is over the keys, used as given.
        """
        if attention_mask is not None and attention_mask.dim() == 4:
            keys = None if key_cache_positions is None else key_cache_positions.shape[0]
            mask = self._check_4d(
                attention_mask, batch_size=batch_size, q_len=q_len, kv_len=kv_len, dtype=dtype, keys=keys
            )
            if key_cache_positions is None or mask.shape[-1] != kv_len:
                return mask
            return self._at_keys(mask, key_cache_positions)
        padding = None
        if attention_mask is not None:
            padding = self._check_2d(attention_mask, batch_size=batch_size, q_len=q_len, kv_len=kv_len)
        if key_cache_positions is None:
            mask = self._causal(cache_position, torch.arange(kv_len, device=cache_position.device))  # [q_len, kv_len]
        else:
            mask = self._causal(cache_position, key_cache_positions) & (key_cache_positions >= 0)  # [q_len, keys]
            if padding is not None:
                padding = padding[:, key_cache_positions.clamp(min=0)]  # [batch, keys]
        if cache_position.dim() == 2:  # per row: [batch, q_len, kv_len]
            return mask[:, None] if padding is None else mask[:, None] & padding[:, None, None, :]
        if padding is None:
            return mask[None, None].expand(batch_size, 1, q_len, mask.shape[-1])
        return mask[None, None] & padding[:, None, None, :]

    def keys_not_held(
        self,
        attention_mask: torch.Tensor | None,
        *,
        batch_size: int,
        q_len: int,
        kv_len: int,
        cache_position: torch.Tensor,
        key_cache_positions: torch.Tensor,
    ) -> torch.Tensor:
        """Cache positions `[n]` that `attention_mask` (as `to_4d` takes it) lets some query attend but no ring key
        `key_cache_positions` holds: keys the ring has dropped (written out of order, or overwritten); a mask read
        at the ring's keys would silently miss them. Additive values below -1e4 count as masked. A 4D mask over the
        ring's keys is not checked (it says nothing about positions)."""
        positions = torch.arange(kv_len, device=cache_position.device)
        if attention_mask is not None and attention_mask.dim() == 4:
            keys = key_cache_positions.shape[0]
            mask = self._check_4d(attention_mask, batch_size=batch_size, q_len=q_len, kv_len=kv_len, keys=keys)
            if mask.shape[-1] != kv_len:
                return positions[:0]
            allowed = mask if mask.dtype == torch.bool else mask > -1e4
            needed = allowed.flatten(0, 2).any(0)  # [kv_len]
        else:
            # some query sees the position: q - W < p <= q, for the first query at or after p
            queries = cache_position.sort().values
            first = torch.searchsorted(queries, positions).clamp(max=q_len - 1)
            needed = queries[first] >= positions
            if self.sliding_window is not None:
                needed &= queries[first] < positions + self.sliding_window
            if attention_mask is not None:
                needed &= self._check_2d(attention_mask, batch_size=batch_size, q_len=q_len, kv_len=kv_len).any(0)
        held = torch.zeros(kv_len + 1, dtype=torch.bool, device=positions.device)
        held[key_cache_positions.clamp(min=-1)] = True  # -1 (nothing held) lands in the spare last entry
        return positions[needed & ~held[:kv_len]]

    @staticmethod
    def with_bias(mask: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Fold a score bias (ALiBi) into a mask: additive `[batch, heads, q_len, kv_len]`, `bias` where the mask
        allows and the dtype's lowest value where it does not (finite, so no row can become NaN)."""
        lowest = torch.finfo(dtype).min
        if mask.dtype == torch.bool:
            return bias.to(dtype).masked_fill(~mask, lowest)
        return (mask.to(dtype) + bias.to(dtype)).clamp(min=lowest)

    def _causal(self, cache_position: torch.Tensor, key_cache_positions: torch.Tensor) -> torch.Tensor:
        """Causal (and windowed) bool mask `[q_len, keys]` for queries at `cache_position` `[q_len]` over keys at
        `key_cache_positions` (`[batch, q_len, keys]` for per-row `cache_position` `[batch, q_len]`)."""
        kv_idx = key_cache_positions[None, :]
        q_idx = cache_position[..., None]
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
        attention_mask: torch.Tensor,
        *,
        batch_size: int,
        q_len: int,
        kv_len: int,
        dtype: torch.dtype | None = None,
        keys: int | None = None,
    ) -> torch.Tensor:
        """Validate a user's 4D mask (`kv_len` wide, or `keys` wide over a ring's keys); additive masks are clamped
        so no row can turn into NaN."""
        expected = (batch_size, 1, q_len, kv_len)
        shape = tuple(attention_mask.shape)
        if shape[0] not in (1, batch_size) or shape[1:3] != expected[1:3] or shape[3] not in (kv_len, keys):
            ring = f", or {keys} wide over the keys of a sliding-window layer's ring" if keys is not None else ""
            raise ValueError(
                f"4D attention_mask must have shape {list(expected)} [batch, 1, q_len, kv_len], where kv_len is "
                f"the key length attention sees (the static cache's max_cache_len, or past + q_len){ring}, "
                f"got {list(shape)}"
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

    @staticmethod
    def _at_keys(mask: torch.Tensor, key_cache_positions: torch.Tensor) -> torch.Tensor:
        """A 4D mask over cache positions read at a ring's keys: `[batch, 1, q_len, keys]`, keys holding none
        masked."""
        columns = mask[..., key_cache_positions.clamp(min=0)]
        if columns.dtype == torch.bool:
            return columns & (key_cache_positions >= 0)
        return columns.masked_fill(key_cache_positions < 0, torch.finfo(columns.dtype).min)


def attention_type(config: Any, layer_idx: int) -> str:
    """The mask kind of one layer: `config.layer_types[layer_idx]` where the config lists them (a recurrent
    `linear_attention` layer reads the full causal mask, see `visible_slots`), else sliding for every layer when
    the config has a `sliding_window`, else full causal."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        kind = layer_types[layer_idx]
        return FULL_ATTENTION if kind == LINEAR_ATTENTION else kind
    return SLIDING_ATTENTION if getattr(config, "sliding_window", None) else FULL_ATTENTION


def visible_slots(mask: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """What a 4D mask `[batch, 1, q_len, kv_len]` (bool, or additive) means to a recurrent layer: whether each query
    token sees the keys at `slots` `[batch, q_len, n]` (bool `[batch, q_len, n]`; a slot < 0, nothing written,
    is never seen). A recurrent layer asks about the tokens fed before each one (recurrent_utils)."""
    kv_len = mask.shape[-1]
    allowed = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] > torch.finfo(mask.dtype).min / 2
    return allowed.gather(2, slots.clamp(min=0, max=kv_len - 1)) & (slots >= 0)


def mask_converters(config: Any) -> dict[str, AttentionMaskConverter]:
    """One converter per mask kind the model's layers use (so each kind's mask is made once per forward)."""
    kinds = {attention_type(config, i) for i in range(config.num_hidden_layers)}
    windows = {FULL_ATTENTION: None, SLIDING_ATTENTION: getattr(config, "sliding_window", None)}
    return {kind: AttentionMaskConverter(sliding_window=windows[kind]) for kind in sorted(kinds)}


def position_ids_from_padding(padding_mask: torch.Tensor, cache_position: torch.Tensor | None = None) -> torch.Tensor:
    """Positions from a 2D padding mask `[batch, kv_len]` (1 = real token): the count of real tokens before each
    slot, so left-padded rows start at 0 (padding slots get 0). Returns `[batch, kv_len]`, or `[batch, q_len]`
    for the queries at `cache_position` `[q_len]` or per row `[batch, q_len]` (which must lie inside the mask)."""
    positions = (padding_mask.long().cumsum(-1) - 1).clamp(min=0)  # [batch, kv_len]
    if cache_position is not None and cache_position.dim() == 2:
        return positions.gather(1, cache_position)
    return positions if cache_position is None else positions[:, cache_position]


class StaticDecodeMask:
    """The decode-step mask of one kind for one `generate` call on a StaticCache: `[batch, 1, 1, slots]` (the
    kind's cache slots: `max_cache_len`, or a sliding-window ring's), allocated once, then moved forward one slot in
    place per step (so a compiled decode step always reads the same tensor, and nothing is allocated or read back
    on the host)."""

    def __init__(
        self,
        converter: AttentionMaskConverter,
        padding_mask: torch.Tensor,
        cache_position: torch.Tensor,
        key_cache_positions: torch.Tensor | None = None,
    ) -> None:
        """`padding_mask` `[batch, max_cache_len]` (1 = real token; slots not yet written 1); `cache_position`
        `[1]` the slot of the last token already in the cache: the buffer starts as that token's mask row;
        `key_cache_positions` `[slots]` the cache position each slot of a ring holds (see `to_4d`)."""
        batch_size, max_cache_len = padding_mask.shape
        self.sliding_window = converter.sliding_window
        self.mask = converter.to_4d(
            padding_mask,
            batch_size=batch_size,
            q_len=1,
            kv_len=max_cache_len,
            cache_position=cache_position,
            key_cache_positions=key_cache_positions,
        ).clone()  # [batch, 1, 1, slots]
        self.opening = torch.empty_like(cache_position)  # [1], the new token's slot
        self.leaving = torch.empty_like(cache_position)  # [1], the slot leaving the window (sliding kinds)

    def advance(self, cache_position: torch.Tensor) -> torch.Tensor:
        """Open the slot of cache position `cache_position` `[1]` in place (and close the one leaving the window);
        returns the mask."""
        slots = self.mask.shape[-1]
        torch.remainder(cache_position, slots, out=self.opening)  # a ring holds position p in slot p % slots
        self.mask.index_fill_(-1, self.opening, True)
        # A ring of exactly W slots: the leaving slot is the new token's own. Before the window is full, (pos - W)
        # wraps to a slot in the future (or never written), which is still closed.
        if self.sliding_window is not None and self.sliding_window < slots:
            torch.sub(cache_position, self.sliding_window, out=self.leaving).remainder_(slots)
            self.mask.index_fill_(-1, self.leaving, False)
        return self.mask
