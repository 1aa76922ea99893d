"""Key/value caches: DynamicCache grows by concatenation, StaticCache is allocated once and never changes shape.

A StaticCache gives each sliding-window layer (window W) a ring of `W - 1 + prefill_chunk_size` slots instead of
`max_cache_len`: cache position p lives in slot `p % slots`, and the cache records which position each slot holds
(`ring_cache_positions`), from which that layer's masks are built (`AttentionMaskConverter.to_4d`). A forward of up
to `prefill_chunk_size` tokens writes in place and its queries find their W keys (the W - 1 before the first, the
chunk itself) in the ring; a longer one attends the ring as it was plus its new states, as upstream's
StaticSlidingWindowLayer does, and keeps the last `slots` of them.

Per-row positions (a server's slots, each row a request at its own length): `cache_position` may be
`[batch, q_len]`, each row writing its own slots (a scatter on the slot axis; shapes fixed, no host read), and
`StaticCache.rows(rows)` is a view that writes and attends only the rows `rows` `[batch]` (a prefill chunk into one
row). Per-row positions need full-length slots: a cache with sliding-window rings refuses them.

Layers differ: a config may give a layer other key/value shapes, or none (`kv_cache_shape(layer_idx)`: a layer that
reuses another layer's keys/values, a recurrent layer), or keys only (`(kv_heads, key_dim, 0)`: latent attention, whose
value is a slice of its key; `update(key, None, ...)` returns `(keys, None)`, and no value slots are allocated), and a recurrent layer keeps fixed-size states per row
(`recurrent_state_shapes(layer_idx)`: e.g. a gated delta-net's convolution window and its recurrent state), read
with `states(layer_idx)` and written back in place with `update_states` (see recurrent_utils).
"""

from __future__ import annotations

import dataclasses

import torch

from .configuration_utils import PretrainedConfig
from .modeling_attn_mask_utils import LINEAR_ATTENTION, attention_type, mask_converters

# generate's default prefill chunk: the room a StaticCache's sliding-window rings leave for one forward's tokens.
DEFAULT_PREFILL_CHUNK_SIZE = 32


class Cache:
    """Holds keys/values per layer. `update` stores the new states at `cache_position` and returns all of them."""

    max_cache_len: int | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def get_seq_length(self) -> int:
        """Tokens already stored (a StaticCache's capacity is `max_cache_len`; see `kv_len`)."""
        raise NotImplementedError

    def kv_len(self, q_len: int) -> int:
        """The key length attention sees once `q_len` new tokens are stored (ring layers: see `ring_key_positions`)."""
        raise NotImplementedError

    def validate(self, batch_size: int, cache_position: torch.Tensor) -> None:
        """Raise a ValueError before any write if `batch_size` rows of tokens at `cache_position` (`[q_len]`, or
        `[batch, q_len]` per row) do not fit."""

    def update_positions(self, position_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        """Store the new tokens' positions `[batch, q_len]`; return every key slot's position `[batch, kv_len]`
        (what ALiBi needs, and what a 2D mask cannot tell when sequences are packed)."""
        raise NotImplementedError

    def ring_key_positions(self, cache_position: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per attention kind kept in a ring: the cache position of every key its layers attend in a forward that
        writes `cache_position` `[q_len]` (`[keys]`, -1 where a key holds nothing). Writes nothing. None here."""
        return {}

    def update_ring_positions(self, cache_position: torch.Tensor) -> None:
        """Record the cache positions the rings hold once `cache_position` is written (before the layers write)."""

    def states(self, layer_idx: int) -> dict[str, torch.Tensor] | None:
        """A recurrent layer's states by name (`[batch, ...]`), None before its first write (zeros)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no recurrent states")

    def update_states(self, layer_idx: int, states: dict[str, torch.Tensor]) -> None:
        """Store a recurrent layer's new states (a StaticCache copies them into its buffers in place)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no recurrent states")


class DynamicCache(Cache):
    """Concatenates new keys/values along the sequence axis; shapes grow every step (not for compiled decoding)."""

    def __init__(self) -> None:
        # per layer: [batch, kv_heads, seq, head_dim], None for a layer that stored nothing (yet)
        self.key_cache: list[torch.Tensor | None] = []
        self.value_cache: list[torch.Tensor | None] = []
        self.key_positions: torch.Tensor | None = None  # [batch, seq]
        self.layer_states: dict[int, dict[str, torch.Tensor]] = {}  # recurrent layers' states

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        missing = layer_idx + 1 - len(self.key_cache)
        self.key_cache += [None] * missing
        self.value_cache += [None] * missing
        keys, values = self.key_cache[layer_idx], self.value_cache[layer_idx]
        if keys is not None:
            key_states = torch.cat([keys, key_states], dim=-2)
            value_states = None if value_states is None else torch.cat([values, value_states], dim=-2)
        self.key_cache[layer_idx], self.value_cache[layer_idx] = key_states, value_states
        return key_states, value_states

    def states(self, layer_idx: int) -> dict[str, torch.Tensor] | None:
        return self.layer_states.get(layer_idx)

    def update_states(self, layer_idx: int, states: dict[str, torch.Tensor]) -> None:
        self.layer_states[layer_idx] = states

    def stored(self) -> list[torch.Tensor]:
        """Every layer's stored keys (skipping layers without any)."""
        return [keys for keys in self.key_cache if keys is not None]

    def get_seq_length(self) -> int:
        stored = self.stored()
        return stored[0].shape[-2] if stored else 0

    def update_positions(self, position_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        previous = self.key_positions
        self.key_positions = position_ids if previous is None else torch.cat([previous, position_ids], dim=-1)
        return self.key_positions

    def kv_len(self, q_len: int) -> int:
        return self.get_seq_length() + q_len

    def validate(self, batch_size: int, cache_position: torch.Tensor) -> None:
        held = self.stored() or [s for states in self.layer_states.values() for s in states.values()]
        if held and held[0].shape[0] != batch_size:
            raise ValueError(f"batch size {batch_size} does not match the cache's {held[0].shape[0]}")


class StaticCache(Cache):
    """Keys and values for every layer, allocated once: `[max_batch_size, kv_heads, slots, head_dim]`.

    Full-attention layers have `max_cache_len` slots, cache position p in slot p. Sliding-window layers (window W)
    have a ring of `W - 1 + prefill_chunk_size` slots when that is fewer (position p in slot `p % slots`;
    `ring_cache_positions[kind]` `[slots]` holds each slot's position, -1 never written). Writes go to their slots
    with `index_copy_`; attention sees every slot of its layer and the mask hides the ones not written yet, stale,
    or out of the window, so every decode step has the same shapes.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        max_batch_size: int,
        max_cache_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        *,
        prefill_chunk_size: int = DEFAULT_PREFILL_CHUNK_SIZE,
    ) -> None:
        if max_batch_size < 1 or max_cache_len < 1 or prefill_chunk_size < 1:
            raise ValueError(
                "StaticCache needs max_batch_size >= 1, max_cache_len >= 1 and prefill_chunk_size >= 1, got "
                f"{max_batch_size}, {max_cache_len}, {prefill_chunk_size}"
            )
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        kv_shapes = kv_cache_shapes(config)
        # {kind: window} of the sliding kinds whose ring is shorter than the full length
        self.ring_windows = {
            kind: converter.sliding_window
            for kind, converter in mask_converters(config).items()
            if converter.sliding_window is not None
            and ring_slots(converter.sliding_window, prefill_chunk_size) < max_cache_len
        }
        self.ring_cache_positions = {
            kind: torch.full((ring_slots(window, prefill_chunk_size),), -1, dtype=torch.long, device=device)
            for kind, window in self.ring_windows.items()
        }  # per ring kind: [slots], the cache position each slot holds (-1: never written)
        # per layer: its ring's window, None for full-length slots
        self.layer_windows = [self.ring_windows.get(attention_type(config, i)) for i in range(len(kv_shapes))]
        # per layer: [max_batch_size, kv_heads, slots, head_dim], None for a layer without key/value slots (values:
        # also for a key-only layer)
        self.key_cache: list[torch.Tensor | None] = []
        self.value_cache: list[torch.Tensor | None] = []
        for window, kv_shape in zip(self.layer_windows, kv_shapes, strict=True):
            slots = max_cache_len if window is None else ring_slots(window, prefill_chunk_size)
            kv_heads, key_dim, value_dim = slot_dims(kv_shape) if kv_shape is not None else (0, 0, 0)
            for store, dim in ((self.key_cache, key_dim), (self.value_cache, value_dim)):
                store.append(
                    None
                    if kv_shape is None or dim == 0
                    else torch.zeros(max_batch_size, kv_heads, slots, dim, dtype=dtype, device=device)
                )
        # per recurrent layer: its states by name, [max_batch_size, *shape]
        self.state_specs = {i: specs for i, specs in enumerate(recurrent_state_specs(config)) if specs}
        self.layer_states = {
            i: {
                name: torch.full((max_batch_size, *spec.shape), spec.fill, dtype=spec.dtype or dtype, device=device)
                for name, spec in specs.items()
            }
            for i, specs in self.state_specs.items()
        }
        self.key_positions = torch.zeros(max_batch_size, max_cache_len, dtype=torch.long, device=device)
        for tensor in self._buffers():
            torch._dynamo.mark_static_address(tensor)

    def _buffers(self) -> list[torch.Tensor]:
        """Every tensor the cache holds (their addresses never change)."""
        slots = [t for t in (*self.key_cache, *self.value_cache) if t is not None]
        states = [t for states in self.layer_states.values() for t in states.values()]
        return [*slots, *states, self.key_positions, *self.ring_cache_positions.values()]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(layer_idx).update_layer(key_states, value_states, cache_position)

    def layer(self, layer_idx: int) -> StaticLayerCache | RecurrentLayerCache:
        """Layer `layer_idx`'s slot: what a compiled layer body gets instead of a layer index (see
        StaticLayerCache; a recurrent layer's is its states, RecurrentLayerCache)."""
        if layer_idx in self.layer_states:
            return RecurrentLayerCache(self.layer_states[layer_idx])
        return StaticLayerCache(self.key_cache[layer_idx], self.value_cache[layer_idx], self.layer_windows[layer_idx])

    def states(self, layer_idx: int) -> dict[str, torch.Tensor]:
        return self.layer_states[layer_idx]

    def update_states(self, layer_idx: int, states: dict[str, torch.Tensor]) -> None:
        RecurrentLayerCache(self.layer_states[layer_idx]).update_states(layer_idx, states)

    def update_positions(self, position_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        key_positions = self.key_positions[: position_ids.shape[0]]  # [batch, max_cache_len]
        if cache_position.dim() == 2:  # per row: [batch, q_len]
            return key_positions.scatter_(1, cache_position, position_ids)
        key_positions.index_copy_(1, cache_position, position_ids)
        return key_positions

    def rows(self, rows: torch.Tensor) -> StaticCacheRows:
        """A view of the rows `rows` `[batch]` of this cache (see StaticCacheRows)."""
        return StaticCacheRows(self, rows)

    def ring_key_positions(self, cache_position: torch.Tensor) -> dict[str, torch.Tensor]:
        self._check_rows_fit_rings(cache_position)
        positions = {}
        for kind, window in self.ring_windows.items():
            held = self.ring_cache_positions[kind]  # [slots]
            slots = held.shape[0]
            if ring_overflows(slots, window, cache_position.shape[0]):
                # the ring as it was (a position written again now is stale there), then the new tokens
                before = held.masked_fill(torch.isin(held, cache_position), -1)
                positions[kind] = torch.cat([before, cache_position])  # [slots + q_len]
            else:
                positions[kind] = held.index_copy(0, cache_position % slots, cache_position)  # [slots]
        return positions

    def update_ring_positions(self, cache_position: torch.Tensor) -> None:
        for held in self.ring_cache_positions.values():
            slots = held.shape[0]
            written = cache_position[-slots:]  # a longer forward keeps its last `slots` tokens
            held.index_copy_(0, written % slots, written)

    def get_seq_length(self) -> int:
        """Slots written so far, counted as upstream counts them: the slots of the first full-length layer and row
        holding a nonzero key; with ring layers only, one past the last position the ring holds (one host read; the
        static path itself never asks, it passes `cache_position`)."""
        full = [i for i, window in enumerate(self.layer_windows) if window is None and self.key_cache[i] is not None]
        if full:
            return int(self.key_cache[full[0]][0].any(dim=-1).any(dim=0).sum())
        return int(next(iter(self.ring_cache_positions.values())).max()) + 1

    def kv_len(self, q_len: int) -> int:
        return self.max_cache_len

    def validate(self, batch_size: int, cache_position: torch.Tensor) -> None:
        if batch_size > self.max_batch_size:
            raise ValueError(
                f"batch size {batch_size} is larger than the StaticCache's max_batch_size {self.max_batch_size}"
            )
        # One host read per forward; compiled code skips this check (generate sizes the cache up front).
        if cache_position.numel() and int(cache_position.max()) >= self.max_cache_len:
            raise ValueError(
                f"cache_position reaches {int(cache_position.max())}, past the StaticCache's max_cache_len "
                f"{self.max_cache_len} (valid slots 0..{self.max_cache_len - 1})"
            )
        self._check_rows_fit_rings(cache_position)
        for kind, held in self.ring_cache_positions.items():
            slots = held.shape[0]
            written = cache_position[-slots:] % slots
            if written.unique().numel() < written.numel():
                raise ValueError(
                    f"cache_position {cache_position.tolist()} writes two tokens to one slot of the {kind} layers' "
                    f"ring ({slots} slots, position p in slot p % {slots}): one forward writes each slot once"
                )

    def _check_rows_fit_rings(self, cache_position: torch.Tensor) -> None:
        """Per-row cache positions `[batch, q_len]` need full-length slots: a ring holds one record of positions
        for all rows (a shape check, free under compile)."""
        if cache_position.dim() == 2 and self.ring_windows:
            raise ValueError(
                f"per-row cache_position {list(cache_position.shape)} [batch, q_len] needs full-length slots, but "
                f"this StaticCache keeps its sliding-window layers in rings (windows {self.ring_windows}): build it "
                "with prefill_chunk_size >= max_cache_len - window + 1 (full-length slots), or share one "
                "cache_position [q_len] by all rows"
            )

    def reset(self) -> None:
        """Zero every slot in place, rings unwritten (shapes and addresses unchanged, so compiled graphs stay
        valid)."""
        for tensor in self._buffers():
            tensor.zero_()
        for held in self.ring_cache_positions.values():
            held.fill_(-1)
        for i, specs in self.state_specs.items():
            for name, spec in specs.items():
                self.layer_states[i][name].fill_(spec.fill)


class StaticLayerCache:
    """One layer's keys and values of a StaticCache `[max_batch_size, kv_heads, slots, head_dim]` (values None for a
    key-only layer: then `update_layer` takes and returns None for them), and its ring's window (None: full-length
    slots).

    Attention reaches it without a layer index (`attention_forward`), so identical decoder layers handed their
    own slot compile to one shared body: a per-layer Python int would be a constant of each compiled graph."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor | None, window: int | None = None) -> None:
        self.keys, self.values, self.window = keys, values, window

    def update_layer(
        self, key_states: torch.Tensor, value_states: torch.Tensor | None, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Write `[batch, kv_heads, q_len, head_dim]` at `cache_position` (`[q_len]`, or `[batch, q_len]`: each
        row its own slots); return what attention sees: all slots of the batch's rows, or for a ring given more
        tokens than its room, the ring as it was then the new states."""
        if self.values is None:  # a key-only layer
            return self._update_one(self.keys, key_states, cache_position), None
        return (
            self._update_one(self.keys, key_states, cache_position),
            self._update_one(self.values, value_states, cache_position),
        )

    def _update_one(self, held: torch.Tensor, states: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        """Write `states` `[batch, kv_heads, q_len, dim]` into `held` (the keys or the values) as `update_layer`
        says; return what attention sees of them."""
        held = held[: states.shape[0]]  # [batch, kv_heads, slots, dim]
        states = states.to(held.dtype)
        if cache_position.dim() == 2:  # per row (full-length slots only: StaticCache refuses rings)
            index = cache_position[:, None, :, None].expand_as(states)  # [batch, kv_heads, q_len, dim]
            return held.scatter_(2, index, states)
        attended = held
        if self.window is not None:  # a ring: cache position p lives in slot p % slots
            slots = held.shape[2]
            if ring_overflows(slots, self.window, states.shape[2]):
                # [batch, kv_heads, slots + q_len, dim], copied before the write below
                attended = torch.cat([held, states], dim=2)
                states, cache_position = states[:, :, -slots:], cache_position[-slots:]
            cache_position = cache_position % slots
        held.index_copy_(2, cache_position, states)
        return attended

    def update_rows(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor | None,
        cache_position: torch.Tensor,
        rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Write `[batch, kv_heads, q_len, head_dim]` into the cache rows `rows` `[batch]` at `cache_position`
        (`[q_len]` or `[batch, q_len]`); return those rows' slots `[batch, kv_heads, slots, head_dim]` (a copy)."""
        batch, kv_heads, q_len, _ = key_states.shape
        slots = cache_position.expand(batch, q_len)  # [batch, q_len]
        heads = torch.arange(kv_heads, device=rows.device)
        index = (rows[:, None, None], heads[None, :, None], slots[:, None, :])  # broadcast to [batch, kv_heads, q_len]
        self.keys.index_put_(index, key_states.to(self.keys.dtype))
        if self.values is None:  # a key-only layer
            return self.keys.index_select(0, rows), None
        self.values.index_put_(index, value_states.to(self.values.dtype))
        return self.keys.index_select(0, rows), self.values.index_select(0, rows)


class StaticCacheRows(Cache):
    """Rows `rows` `[batch]` of a StaticCache (full-length slots) as a cache of `batch` rows: a forward through it
    writes and attends only those rows, e.g. a server's prefill chunk into one request's row while the other rows
    hold other requests. `rows` is a device tensor, so one compiled graph serves any choice of rows: keep one view
    and set its rows in place (`view.rows.copy_(...)`) between forwards. Key/value reads are copies of the rows
    (`index_select`), a small cost beside a prefill chunk's products."""

    def __init__(self, cache: StaticCache, rows: torch.Tensor) -> None:
        if cache.ring_windows:
            raise ValueError(
                f"StaticCache.rows needs full-length slots, but this cache keeps sliding-window rings "
                f"(windows {cache.ring_windows})"
            )
        if rows.dim() != 1 or rows.dtype != torch.long:
            raise ValueError(f"rows must be a 1D int64 tensor [batch], got {rows.dtype} {list(rows.shape)}")
        self.cache, self.rows = cache, rows
        self.max_cache_len = cache.max_cache_len

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.layer(layer_idx).update_rows(key_states, value_states, cache_position, self.rows)

    def states(self, layer_idx: int) -> dict[str, torch.Tensor]:
        """The rows' states of a recurrent layer (copies: `index_select`)."""
        return {name: state.index_select(0, self.rows) for name, state in self.cache.layer_states[layer_idx].items()}

    def update_states(self, layer_idx: int, states: dict[str, torch.Tensor]) -> None:
        held = self.cache.layer_states[layer_idx]
        for name, state in states.items():
            held[name].index_copy_(0, self.rows, state.to(held[name].dtype))

    def update_positions(self, position_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        slots = cache_position.expand_as(position_ids)  # [batch, q_len]
        self.cache.key_positions.index_put_((self.rows[:, None], slots), position_ids)
        return self.cache.key_positions.index_select(0, self.rows)  # [batch, max_cache_len]

    def kv_len(self, q_len: int) -> int:
        return self.max_cache_len

    def get_seq_length(self) -> int:
        raise NotImplementedError("a StaticCacheRows view has no length: pass cache_position")

    def validate(self, batch_size: int, cache_position: torch.Tensor) -> None:
        if batch_size != self.rows.shape[0]:
            raise ValueError(f"batch size {batch_size} does not match the {self.rows.shape[0]} rows of the view")
        if self.rows.numel() and not 0 <= int(self.rows.min()) <= int(self.rows.max()) < self.cache.max_batch_size:
            raise ValueError(f"rows {self.rows.tolist()} outside the StaticCache's {self.cache.max_batch_size} rows")
        self.cache.validate(batch_size, cache_position)


def ring_slots(window: int, prefill_chunk_size: int) -> int:
    """Slots of a sliding-window ring: a chunk's queries need the `window - 1` keys before it and the chunk."""
    return window - 1 + prefill_chunk_size


def ring_overflows(slots: int, window: int, q_len: int) -> bool:
    """Whether `q_len` new tokens exceed a ring's room (writing them in place would evict keys of their window)."""
    return q_len > slots - window + 1


def kv_cache_shapes(config: PretrainedConfig) -> list[tuple[int, ...] | None]:
    """Per layer, its `layer_kv_shapes` entry with this rank's kv heads under tensor parallelism."""
    return [
        None if shape is None else (len(config.tp_heads(shape[0])), *shape[1:]) for shape in layer_kv_shapes(config)
    ]


def slot_dims(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """`(kv_heads, key_dim, value_dim)` of a `layer_kv_shapes` entry: `(kv_heads, head_dim)` keys and values alike,
    or `(kv_heads, key_dim, value_dim)`, value_dim 0 for a key-only layer (no value slots)."""
    if len(shape) == 2:
        return shape[0], shape[1], shape[1]
    kv_heads, key_dim, value_dim = shape
    return kv_heads, key_dim, value_dim


def layer_kv_shapes(config: PretrainedConfig) -> list[tuple[int, ...] | None]:
    """Per layer, `(kv_heads, head_dim)` of its keys/values (or `(kv_heads, key_dim, value_dim)` where they differ,
    value_dim 0 for a layer that keeps keys only: see `slot_dims`), or None for a layer that keeps none. A config
    whose layers differ says so with `kv_cache_shape(layer_idx)`; otherwise every layer has `attention_shape`'s,
    except recurrent (`linear_attention`) layers, which have none."""
    if hasattr(config, "kv_cache_shape"):
        return [config.kv_cache_shape(i) for i in range(config.num_hidden_layers)]
    _, kv_heads, head_dim = attention_shape(config)
    layer_types = getattr(config, "layer_types", None) or [None] * config.num_hidden_layers
    return [None if kind == LINEAR_ATTENTION else (kv_heads, head_dim) for kind in layer_types]


@dataclasses.dataclass(frozen=True)
class RecurrentState:
    """One recurrent state of a layer: its shape per row, its dtype (None: the cache's) and its value before anything
    is written."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    fill: float = 0


def recurrent_state_specs(config: PretrainedConfig) -> list[dict[str, RecurrentState]]:
    """Per layer, `{name: RecurrentState}` of its recurrent states (empty for a layer without), from the config's
    `recurrent_state_shapes(layer_idx)`."""
    specs = getattr(config, "recurrent_state_shapes", None)
    return [(specs(i) if specs else None) or {} for i in range(config.num_hidden_layers)]


def attention_shape(config: PretrainedConfig) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) of every attention layer of a model config, in upstream's field names."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, head_dim


class RecurrentLayerCache:
    """One recurrent layer's states of a StaticCache, `{name: [max_batch_size, ...]}`: what a compiled layer body
    gets in place of the cache. `update_states` copies the new states into the same storage (the first `batch`
    rows), so compiled graphs (and CUDA graphs) keep their addresses."""

    def __init__(self, layer_states: dict[str, torch.Tensor]) -> None:
        self.layer_states = layer_states

    def states(self, layer_idx: int) -> dict[str, torch.Tensor]:
        return self.layer_states

    def update_states(self, layer_idx: int, states: dict[str, torch.Tensor]) -> None:
        for name, state in states.items():
            held = self.layer_states[name]
            held[: state.shape[0]].copy_(state)
