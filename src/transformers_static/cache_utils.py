"""Key/value caches: DynamicCache grows by concatenation, StaticCache is allocated once and never changes shape."""

from __future__ import annotations

import torch

from .configuration_utils import PretrainedConfig


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
        """The key length attention sees once `q_len` new tokens are stored."""
        raise NotImplementedError

    def validate(self, batch_size: int, cache_position: torch.Tensor) -> None:
        """Raise a ValueError before any write if `batch_size` tokens at `cache_position` do not fit."""

    def update_positions(self, position_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        """Store the new tokens' positions `[batch, q_len]`; return every key slot's position `[batch, kv_len]`
        (what ALiBi needs, and what a 2D mask cannot tell when sequences are packed)."""
        raise NotImplementedError


class DynamicCache(Cache):
    """Concatenates new keys/values along the sequence axis; shapes grow every step (not for compiled decoding)."""

    def __init__(self) -> None:
        self.key_cache: list[torch.Tensor] = []  # per layer: [batch, kv_heads, seq, head_dim]
        self.value_cache: list[torch.Tensor] = []
        self.key_positions: torch.Tensor | None = None  # [batch, seq]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx == len(self.key_cache):
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get_seq_length(self) -> int:
        return self.key_cache[0].shape[-2] if self.key_cache else 0

    def update_positions(self, position_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        previous = self.key_positions
        self.key_positions = position_ids if previous is None else torch.cat([previous, position_ids], dim=-1)
        return self.key_positions

    def kv_len(self, q_len: int) -> int:
        return self.get_seq_length() + q_len

    def validate(self, batch_size: int, cache_position: torch.Tensor) -> None:
        if self.key_cache and self.key_cache[0].shape[0] != batch_size:
            raise ValueError(f"batch size {batch_size} does not match the cache's {self.key_cache[0].shape[0]}")


class StaticCache(Cache):
    """Preallocated `[max_batch_size, kv_heads, max_cache_len, head_dim]` keys and values for every layer.

    Writes go to `cache_position` with `index_copy_`; attention always sees all `max_cache_len` slots and the
    mask hides the ones not written yet, so every decode step has the same shapes.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        max_batch_size: int,
        max_cache_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if max_batch_size < 1 or max_cache_len < 1:
            raise ValueError(
                f"StaticCache needs max_batch_size >= 1 and max_cache_len >= 1, got {max_batch_size}, {max_cache_len}"
            )
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        num_layers, kv_heads, head_dim = cache_shape(config)
        shape = (max_batch_size, kv_heads, max_cache_len, head_dim)
        self.key_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.value_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.key_positions = torch.zeros(max_batch_size, max_cache_len, dtype=torch.long, device=device)
        for tensor in (*self.key_cache, *self.value_cache, self.key_positions):
            torch._dynamo.mark_static_address(tensor)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(layer_idx).update_layer(key_states, value_states, cache_position)

    def layer(self, layer_idx: int) -> StaticLayerCache:
        """Layer `layer_idx`'s slot: what a compiled layer body gets instead of a layer index (see
        StaticLayerCache)."""
        return StaticLayerCache(self.key_cache[layer_idx], self.value_cache[layer_idx])

    def update_positions(self, position_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        key_positions = self.key_positions[: position_ids.shape[0]]  # [batch, max_cache_len]
        key_positions.index_copy_(1, cache_position, position_ids)
        return key_positions

    def get_seq_length(self) -> int:
        """Slots written so far, counted as upstream counts them: the slots of the first layer and row holding a
        nonzero key (one host read; the static path itself never asks, it passes `cache_position`)."""
        return int(self.key_cache[0][0].any(dim=-1).any(dim=0).sum())

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

    def reset(self) -> None:
        """Zero every slot in place (shapes and addresses unchanged, so compiled graphs stay valid)."""
        for tensor in (*self.key_cache, *self.value_cache, self.key_positions):
            tensor.zero_()


class StaticLayerCache:
    """One layer's keys and values of a StaticCache `[max_batch_size, kv_heads, max_cache_len, head_dim]`.

    Attention reaches it without a layer index (`attention_forward`), so identical decoder layers handed their
    own slot compile to one shared body: a per-layer Python int would be a constant of each compiled graph."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values

    def update_layer(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write `[batch, kv_heads, q_len, head_dim]` at `cache_position`; return all slots of the batch's rows."""
        batch = key_states.shape[0]
        keys, values = self.keys[:batch], self.values[:batch]  # [batch, kv_heads, max_cache_len, head_dim]
        keys.index_copy_(2, cache_position, key_states.to(keys.dtype))
        values.index_copy_(2, cache_position, value_states.to(values.dtype))
        return keys, values


def cache_shape(config: PretrainedConfig) -> tuple[int, int, int]:
    """(num_layers, kv_heads, head_dim) of a model config's cache; under tensor parallelism, this rank's kv heads."""
    _, kv_heads, head_dim = attention_shape(config)
    return config.num_hidden_layers, len(config.tp_heads(kv_heads)), head_dim


def attention_shape(config: PretrainedConfig) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) of every attention layer of a model config, in upstream's field names."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, head_dim
