"""What every base model prepares once per forward, before its layers: the input embeddings, the cache,
`cache_position`, `position_ids`, one 4D mask per attention kind, and (for ALiBi) every key slot's position."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from .cache_utils import Cache, DynamicCache
from .modeling_attn_mask_utils import position_ids_from_padding

if TYPE_CHECKING:
    from .modeling_utils import PreTrainedModel


_inputs_checked: ContextVar[bool] = ContextVar("transformers_static_inputs_checked", default=False)


@contextmanager
def inputs_checked() -> Iterator[None]:
    """Forwards run inside skip their host-side input checks (token ids, cache room, position table): the caller,
    `generate`, checked the prompt, the cache size and the positions once up front, so its steps read nothing from
    the device."""
    token = _inputs_checked.set(True)
    try:
        yield
    finally:
        _inputs_checked.reset(token)


def checks_inputs() -> bool:
    """Whether this forward checks its inputs on the host (a device read): eager forwards outside `inputs_checked`;
    never while compiling."""
    return not torch.compiler.is_compiling() and not _inputs_checked.get()


@dataclass
class AttentionInputs:
    """What every decoder layer needs besides hidden states, prepared once per forward."""

    # per attention kind: [batch, 1 | heads, q_len, kv_len] (a sliding-window ring's kind: its keys), bool or additive
    masks: dict[str, torch.Tensor]
    position_ids: torch.Tensor  # [batch, q_len]
    cache_position: torch.Tensor  # [q_len], or [batch, q_len] per row (a StaticCache's rows at their own lengths)
    past_key_values: Cache | None
    key_positions: torch.Tensor | None = None  # [batch, kv_len], only for models that ask (ALiBi)


def embed_inputs(
    input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, embed_tokens: nn.Module
) -> torch.Tensor:
    """`[batch, q_len, hidden]` embeddings from exactly one of `input_ids` `[batch, q_len]` or `inputs_embeds`."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids [batch, q_len] or inputs_embeds [batch, q_len, hidden]")
    if inputs_embeds is not None:
        return inputs_embeds
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2D [batch, q_len], got shape {list(input_ids.shape)}")
    if checks_inputs():
        check_token_ids(input_ids, embed_tokens.num_embeddings)
    return embed_tokens(input_ids)


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, real: torch.Tensor | None = None) -> None:
    """A ValueError naming the rows of `input_ids` `[batch, len]` holding ids outside `[0, vocab_size)` (only where
    `real`, a padding mask, is nonzero)."""
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    if real is not None:
        bad &= real.bool()
    if bad.any():
        rows = bad.any(-1).nonzero().flatten().tolist()
        raise ValueError(
            f"input_ids rows {rows} hold token ids outside the vocabulary [0, {vocab_size}): "
            f"{sorted(set(input_ids[bad].tolist()))[:8]}"
        )


def prepare_attention_inputs(
    model: PreTrainedModel,
    inputs_embeds: torch.Tensor,
    *,
    attention_mask: torch.Tensor | dict[str, torch.Tensor] | None,
    position_ids: torch.Tensor | None,
    past_key_values: Cache | None,
    cache_position: torch.Tensor | None,
    use_cache: bool | None,
    with_key_positions: bool = False,
) -> AttentionInputs:
    """Resolve the cache, `cache_position` `[q_len]`, `position_ids` `[batch, q_len]` and one 4D mask per attention
    kind (the keys of `model.mask_converters`) for `inputs_embeds` `[batch, q_len, hidden]`.

    With a StaticCache (or its `rows` view), `cache_position` may be `[batch, q_len]`: each row writes its own slots,
    its queries see the keys of its row up to their own slot (and inside a window, and in its padding mask), and its
    default positions are its cache positions.

    `attention_mask` is None, a 2D padding mask, a 4D mask used as given for every kind, or a dict of 4D masks by
    kind (what generate's decode steps pass). Defaults: a DynamicCache when caching and none is given; cache
    positions right after what the cache holds; positions from the 2D padding mask, else the cache positions.
    `with_key_positions` adds the position of every key slot (recorded by the cache). A kind whose StaticCache
    layers are rings gets its masks over the ring's keys, from the cache positions they hold once this forward has
    written (masks over cache positions are read there; eager forwards check that the ring holds every key they
    allow), and the rings' record is updated before any layer writes.
    """
    batch_size, q_len, _ = inputs_embeds.shape
    use_cache = model.config.use_cache if use_cache is None else use_cache
    if use_cache and past_key_values is None:
        past_key_values = DynamicCache()
    cache_position = _cache_position(cache_position, past_key_values, batch_size, q_len, inputs_embeds.device)
    if past_key_values is not None and checks_inputs():
        past_key_values.validate(batch_size, cache_position)
    kv_len = past_key_values.kv_len(q_len) if past_key_values is not None else q_len
    converters = model.mask_converters
    by_kind = attention_mask if isinstance(attention_mask, dict) else dict.fromkeys(converters, attention_mask)
    if by_kind.keys() != converters.keys():
        raise ValueError(
            f"attention_mask dict must have one mask per kind {sorted(converters)}, got {sorted(by_kind)}"
        )
    # per kind kept in a ring (a StaticCache's sliding-window layers): the cache position of each key it attends
    rings = past_key_values.ring_key_positions(cache_position) if past_key_values is not None else {}
    shapes = dict(batch_size=batch_size, q_len=q_len, kv_len=kv_len, cache_position=cache_position)
    masks = {
        kind: converter.to_4d(by_kind[kind], **shapes, dtype=model.dtype, key_cache_positions=rings.get(kind))
        for kind, converter in converters.items()
    }
    if checks_inputs():  # before any cache write
        for kind, held in rings.items():
            check_ring_keys(kind, converters[kind].keys_not_held(by_kind[kind], **shapes, key_cache_positions=held))
    if position_ids is None:
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            position_ids = position_ids_from_padding(attention_mask, cache_position)
        elif cache_position.dim() == 2:
            position_ids = cache_position
        else:
            position_ids = cache_position[None].expand(batch_size, q_len)
    if checks_inputs():  # before any cache write
        check_position_ids(model, position_ids)
    if past_key_values is not None:
        past_key_values.update_ring_positions(cache_position)
    key_positions = None
    if with_key_positions:
        key_positions = (
            position_ids if past_key_values is None else past_key_values.update_positions(position_ids, cache_position)
        )
    return AttentionInputs(masks, position_ids, cache_position, past_key_values, key_positions)


def _cache_position(
    cache_position: torch.Tensor | None, cache: Cache | None, batch_size: int, q_len: int, device: torch.device
) -> torch.Tensor:
    """The given `cache_position` `[q_len]` (or per row `[batch, q_len]`, static caches only), checked, or the slots
    right after what a dynamic cache holds."""
    if cache_position is None:
        if cache is not None and cache.max_cache_len is not None:
            raise ValueError("cache_position [q_len] is required with a StaticCache: the slots to write")
        past = cache.get_seq_length() if cache is not None else 0
        cache_position = torch.arange(past, past + q_len, device=device)
    static = cache is not None and cache.max_cache_len is not None
    if cache_position.dim() == 2 and static and cache_position.shape == (batch_size, q_len):
        return cache_position
    if cache_position.shape != (q_len,):
        per_row = f", or [{batch_size}, {q_len}] (batch, q_len) with a StaticCache" if static else ""
        raise ValueError(
            f"cache_position must have shape [{q_len}] (q_len){per_row}, got {list(cache_position.shape)}"
        )
    return cache_position


def check_ring_keys(kind: str, missing: torch.Tensor) -> None:
    """A clear ValueError when a mask lets queries attend cache positions `missing` `[n]` that the `kind` layers'
    ring does not hold (one host read)."""
    if missing.numel():
        raise ValueError(
            f"the attention mask lets queries attend cache positions {missing[:8].tolist()} (of {missing.numel()}) "
            f"that the StaticCache's ring for the {kind} layers does not hold (overwritten, or never written: a ring "
            "keeps the last sliding_window - 1 + prefill_chunk_size positions written). Write positions in order "
            "(reset() starts again), or give a mask within the window"
        )


def check_position_ids(model: PreTrainedModel, position_ids: torch.Tensor) -> None:
    """A clear ValueError for positions outside the model's position table, if it has one (one host read)."""
    if model.max_positions is None or not position_ids.numel():
        return
    low, high = torch.stack(torch.aminmax(position_ids)).tolist()
    if low < model.min_position or high >= model.max_positions:
        raise ValueError(
            f"position_ids span {low}..{high}, outside {type(model).__name__}'s position table of "
            f"{model.max_positions} positions (valid positions {model.min_position}..{model.max_positions - 1}; "
            "config n_positions / max_position_embeddings)"
        )
