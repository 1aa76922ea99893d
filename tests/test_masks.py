"""AttentionMaskConverter: small masks written out literally (1 = may attend)."""

import pytest
import torch

from transformers_static import AttentionMaskConverter
from transformers_static.attention_utils import eager_attention, sdpa_attention
from transformers_static.modeling_attn_mask_utils import StaticDecodeMask, position_ids_from_padding


def as_int(mask: torch.Tensor) -> list:
    return mask.int().tolist()


def test_causal_mask_from_none() -> None:
    mask = AttentionMaskConverter().to_4d(None, batch_size=2, q_len=3, kv_len=3, cache_position=torch.arange(3))
    assert mask.shape == (2, 1, 3, 3) and mask.dtype == torch.bool
    assert as_int(mask[1, 0]) == [
        [1, 0, 0],
        [1, 1, 0],
        [1, 1, 1],
    ]


def test_causal_mask_with_past_and_static_capacity() -> None:
    """Two new queries at slots 2 and 3 of a 6-slot cache: later slots stay closed."""
    mask = AttentionMaskConverter().to_4d(None, batch_size=1, q_len=2, kv_len=6, cache_position=torch.tensor([2, 3]))
    assert as_int(mask[0, 0]) == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
    ]


def test_left_padding_mask() -> None:
    padding = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    mask = AttentionMaskConverter().to_4d(padding, batch_size=2, q_len=4, kv_len=4, cache_position=torch.arange(4))
    assert as_int(mask[0, 0]) == [
        [0, 0, 0, 0],
        [0, 0, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 1, 1],
    ]
    assert as_int(mask[1, 0]) == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ]


def test_short_2d_mask_is_extended_to_the_static_capacity() -> None:
    padding = torch.tensor([[0, 1, 1]])  # past 2 + this query; the cache holds 5
    mask = AttentionMaskConverter().to_4d(padding, batch_size=1, q_len=1, kv_len=5, cache_position=torch.tensor([2]))
    assert as_int(mask[0, 0]) == [[0, 1, 1, 0, 0]]


def test_sliding_window_covers_w_keys_including_own() -> None:
    mask = AttentionMaskConverter(sliding_window=2).to_4d(
        None, batch_size=1, q_len=4, kv_len=4, cache_position=torch.arange(4)
    )
    assert as_int(mask[0, 0]) == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 1, 1],
    ]


@pytest.mark.parametrize("window", [None, 2, 3])
def test_static_decode_rows_advance_in_place(window: int | None) -> None:
    """StaticDecodeMask + advance give, step by step, exactly the rows to_4d builds, in one buffer."""
    converter = AttentionMaskConverter(sliding_window=window)
    padding = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])  # full cache length 8
    decode_mask = StaticDecodeMask(converter, padding, torch.tensor([2]))
    decode = decode_mask.mask
    assert as_int(decode[:, 0, 0]) == as_int(
        converter.to_4d(padding, batch_size=2, q_len=1, kv_len=8, cache_position=torch.tensor([2]))[:, 0, 0]
    )
    address = decode.data_ptr()
    for pos in range(3, 8):
        row = decode_mask.advance(torch.tensor([pos]))
        expected = converter.to_4d(padding, batch_size=2, q_len=1, kv_len=8, cache_position=torch.tensor([pos]))
        assert row.data_ptr() == address
        assert torch.equal(row, expected)


def test_static_decode_rows_literal_window() -> None:
    converter = AttentionMaskConverter(sliding_window=2)
    decode = StaticDecodeMask(converter, torch.tensor([[0, 1, 1, 1, 1]]), torch.tensor([1]))
    assert as_int(decode.mask[0, 0]) == [[0, 1, 0, 0, 0]]
    assert as_int(decode.advance(torch.tensor([2]))[0, 0]) == [[0, 1, 1, 0, 0]]
    assert as_int(decode.advance(torch.tensor([3]))[0, 0]) == [[0, 0, 1, 1, 0]]
    assert as_int(decode.advance(torch.tensor([4]))[0, 0]) == [[0, 0, 0, 1, 1]]


def test_user_4d_masks_pass_through() -> None:
    converter = AttentionMaskConverter()
    bool_mask = torch.tensor([[[[True, False], [False, True]]]])  # not causal: used as given
    out = converter.to_4d(bool_mask, batch_size=1, q_len=2, kv_len=2, cache_position=torch.arange(2))
    assert torch.equal(out, bool_mask)
    additive = torch.tensor([[[[0.0, -float("inf")], [0.0, 0.0]]]])
    out = converter.to_4d(
        additive, batch_size=1, q_len=2, kv_len=2, cache_position=torch.arange(2), dtype=torch.float16
    )
    assert out.dtype == torch.float16 and torch.isfinite(out).all() and out[0, 0, 0, 1] < -60000


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (torch.ones(2, 1, 3), "got 3D"),
        (torch.ones(2, 5, dtype=torch.long), r"\[2, L\] with 3 <= L <= 4"),
        (torch.ones(3, 4, dtype=torch.long), r"\[2, L\]"),
        (torch.ones(2, 1, 3, 5, dtype=torch.bool), r"\[2, 1, 3, 4\]"),
        (torch.ones(2, 2, 3, 4, dtype=torch.bool), r"\[2, 1, 3, 4\]"),
        (torch.ones(2, 1, 3, 4, dtype=torch.long), "bool .* or floating"),
    ],
)
def test_bad_masks_name_the_expected_shape(mask: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AttentionMaskConverter().to_4d(mask, batch_size=2, q_len=3, kv_len=4, cache_position=torch.arange(1, 4))


def test_position_ids_from_left_padding() -> None:
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_padding(padding, torch.arange(5)).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert position_ids_from_padding(padding, torch.tensor([4])).tolist() == [[2], [4]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("attention", [eager_attention, sdpa_attention])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_fully_masked_rows_stay_finite(dtype: torch.dtype, attention, kind: str) -> None:
    """A left-padding query sees no key; in half precision with large negative scores, outputs stay finite."""
    module = torch.nn.Module().eval()
    query = torch.randn(1, 2, 3, 4, dtype=dtype) * 30
    key = -query.clone()  # strongly negative scores: the case where scores + finfo.min overflows to -inf
    value = torch.randn(1, 2, 3, 4, dtype=dtype)
    mask = AttentionMaskConverter().to_4d(
        torch.tensor([[0, 1, 1]]), batch_size=1, q_len=3, kv_len=3, cache_position=torch.arange(3)
    )
    if kind == "additive":
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    out, _ = attention(module, query, key, value, mask, scaling=1.0)
    assert torch.isfinite(out).all()


def test_eager_and_sdpa_agree_on_a_bool_mask() -> None:
    module = torch.nn.Module().eval()
    query, key, value = torch.randn(3, 2, 4, 8).unbind(0)
    query, key, value = query[None], key[None], value[None]
    mask = AttentionMaskConverter(sliding_window=2).to_4d(
        None, batch_size=1, q_len=4, kv_len=4, cache_position=torch.arange(4)
    )
    eager, _ = eager_attention(module, query, key, value, mask, scaling=0.35)
    sdpa, _ = sdpa_attention(module, query, key, value, mask, scaling=0.35)
    torch.testing.assert_close(eager, sdpa, atol=1e-6, rtol=0)


def test_one_converter_per_mask_kind() -> None:
    from types import SimpleNamespace

    from transformers_static.modeling_attn_mask_utils import attention_type, mask_converters

    mixed = SimpleNamespace(
        num_hidden_layers=3, sliding_window=4, layer_types=["full_attention", "sliding_attention", "full_attention"]
    )
    converters = mask_converters(mixed)
    assert {kind: c.sliding_window for kind, c in converters.items()} == {
        "full_attention": None,
        "sliding_attention": 4,
    }
    assert [attention_type(mixed, i) for i in range(3)] == mixed.layer_types
    all_sliding = SimpleNamespace(num_hidden_layers=2, sliding_window=4)
    assert {kind: c.sliding_window for kind, c in mask_converters(all_sliding).items()} == {"sliding_attention": 4}
    full = SimpleNamespace(num_hidden_layers=2, sliding_window=None)
    assert list(mask_converters(full)) == ["full_attention"]


def test_bias_is_folded_into_the_mask() -> None:
    mask = AttentionMaskConverter().to_4d(None, batch_size=1, q_len=2, kv_len=2, cache_position=torch.arange(2))
    bias = torch.tensor([[[[0.5, -1.0], [0.5, -1.0]]]]).expand(1, 3, 2, 2)  # [batch, heads, q_len, kv_len]
    folded = AttentionMaskConverter.with_bias(mask, bias, torch.float16)
    lowest = torch.finfo(torch.float16).min
    assert folded.shape == (1, 3, 2, 2) and folded.dtype == torch.float16
    assert folded[0, 2].tolist() == [[0.5, lowest], [0.5, -1.0]]
    additive = torch.zeros(1, 1, 2, 2).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert torch.equal(AttentionMaskConverter.with_bias(additive, bias, torch.float16), folded)


# ---------------------------------------------------------------------- sliding-window rings
RING = torch.tensor([4, 5, 2, 3, -1])  # slot j holds cache position RING[j]; slot 4 never written
RING_PADDING = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])  # over cache positions 0..7


def ring_mask(attention_mask: torch.Tensor | None, **kwargs) -> torch.Tensor:
    converter = AttentionMaskConverter(sliding_window=3)
    shapes = dict(batch_size=2, q_len=2, kv_len=8, cache_position=torch.tensor([4, 5]))
    return converter.to_4d(attention_mask, **shapes, key_cache_positions=RING, **kwargs)


def test_ring_mask_reads_each_slots_position() -> None:
    """Queries at 4 and 5 over a ring's slots: window, causality and row 0's padding (positions 0-2) read at each
    slot's position, the never-written slot closed."""
    mask = ring_mask(RING_PADDING)
    assert mask.shape == (2, 1, 2, 5)
    assert as_int(mask[0, 0]) == [
        [1, 0, 0, 1, 0],  # q=4: positions 2 (padding), 3, 4
        [1, 1, 0, 1, 0],  # q=5: positions 3, 4, 5
    ]
    assert as_int(mask[1, 0]) == [
        [1, 0, 1, 1, 0],
        [1, 1, 0, 1, 0],
    ]


def test_never_written_ring_slots_stay_closed_at_the_start() -> None:
    """Position -1 lies inside the window of the first queries (q - W < -1): only the written-slot predicate
    closes it."""
    mask = AttentionMaskConverter(sliding_window=3).to_4d(
        None,
        batch_size=1,
        q_len=1,
        kv_len=8,
        cache_position=torch.tensor([0]),
        key_cache_positions=torch.tensor([0, -1, -1]),
    )
    assert as_int(mask[0, 0]) == [[1, 0, 0]]


def test_a_4d_mask_over_cache_positions_is_read_at_the_ring_slots() -> None:
    """A user's 4D mask over all cache positions (bool or additive) gives the ring's mask; one as wide as the ring
    is over its slots and used as given; any other width names both."""
    converter = AttentionMaskConverter(sliding_window=3)
    absolute = converter.to_4d(RING_PADDING, batch_size=2, q_len=2, kv_len=8, cache_position=torch.tensor([4, 5]))
    assert torch.equal(ring_mask(absolute), ring_mask(RING_PADDING))
    additive = torch.zeros(absolute.shape).masked_fill(~absolute, float("-inf"))
    read = ring_mask(additive, dtype=torch.float16)
    assert read.dtype == torch.float16 and torch.isfinite(read).all()
    assert torch.equal(read == 0, ring_mask(RING_PADDING))
    over_slots = torch.rand(2, 1, 2, 5) > 0.5
    assert torch.equal(ring_mask(over_slots), over_slots)
    with pytest.raises(ValueError, match=r"\[2, 1, 2, 8\].*or 5 wide over the keys of a sliding-window layer's ring"):
        ring_mask(torch.ones(2, 1, 2, 6, dtype=torch.bool))


def test_keys_a_mask_needs_but_the_ring_dropped_are_named() -> None:
    """Ring of 5 slots holding positions 5..9, window 3: a query at 9 finds its keys; a query sent back to 6, or a
    full-causal 4D mask, needs positions the ring no longer holds."""
    converter = AttentionMaskConverter(sliding_window=3)
    held = torch.tensor([5, 6, 7, 8, 9])

    def missing(mask: torch.Tensor | None, position: int) -> list[int]:
        return converter.keys_not_held(
            mask, batch_size=1, q_len=1, kv_len=12, cache_position=torch.tensor([position]), key_cache_positions=held
        ).tolist()

    assert missing(None, 9) == [] and missing(torch.ones(1, 10), 9) == []
    assert missing(torch.ones(1, 7), 6) == [4]
    assert missing(torch.tensor([[0, 0, 0, 0, 0, 1, 1]]), 6) == []  # position 4 is padding: not needed
    causal = converter.to_4d(None, batch_size=1, q_len=1, kv_len=12, cache_position=torch.tensor([9]))
    assert missing(causal, 9) == []
    assert missing(
        AttentionMaskConverter().to_4d(None, batch_size=1, q_len=1, kv_len=12, cache_position=torch.tensor([9])), 9
    ) == [0, 1, 2, 3, 4]
    assert missing(torch.ones(1, 1, 1, 5, dtype=torch.bool), 9) == []  # over the ring's slots: nothing to check


@pytest.mark.parametrize(("window", "slots"), [(3, 3), (3, 5), (2, 6)])
def test_ring_decode_rows_advance_in_place(window: int, slots: int) -> None:
    """StaticDecodeMask over a ring (as wide as the window, or wider) gives, step by step, the rows to_4d builds
    from the ring's positions after each write, in one buffer."""
    converter = AttentionMaskConverter(sliding_window=window)
    padding = torch.ones(2, 16, dtype=torch.long)
    padding[0, :3] = 0
    held = torch.full((slots,), -1)
    for position in range(7):  # the prompt, written in order
        held[position % slots] = position
    decode_mask = StaticDecodeMask(converter, padding, torch.tensor([6]), held)
    assert decode_mask.mask.shape == (2, 1, 1, slots)
    address = decode_mask.mask.data_ptr()
    for position in range(7, 16):
        held[position % slots] = position
        row = decode_mask.advance(torch.tensor([position]))
        expected = converter.to_4d(
            padding,
            batch_size=2,
            q_len=1,
            kv_len=16,
            cache_position=torch.tensor([position]),
            key_cache_positions=held,
        )
        assert row.data_ptr() == address
        assert torch.equal(row, expected), position


def test_per_row_cache_positions_give_each_row_its_own_causal_rows() -> None:
    """`cache_position` `[batch, q_len]`: each row's queries see its keys up to their own slot."""
    mask = AttentionMaskConverter().to_4d(
        None, batch_size=2, q_len=1, kv_len=5, cache_position=torch.tensor([[3], [1]])
    )
    assert mask.shape == (2, 1, 1, 5)
    assert as_int(mask[:, 0, 0]) == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]


@pytest.mark.parametrize("window", [None, 2])
def test_per_row_masks_match_each_row_built_alone(window: int | None) -> None:
    """Per-row masks (with padding and a window) are the stack of each row's mask at its own positions."""
    converter = AttentionMaskConverter(sliding_window=window)
    padding = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 1]])
    positions = torch.tensor([[2, 3], [4, 5]])
    mask = converter.to_4d(padding, batch_size=2, q_len=2, kv_len=6, cache_position=positions)
    for row in range(2):
        alone = converter.to_4d(padding[row : row + 1], batch_size=1, q_len=2, kv_len=6, cache_position=positions[row])
        assert torch.equal(mask[row : row + 1], alone)
    assert as_int(mask[1, 0]) == (
        [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]] if window else [[1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 1, 1]]
    )


def test_position_ids_from_padding_per_row() -> None:
    padding = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert position_ids_from_padding(padding, torch.tensor([[3], [1]])).tolist() == [[1], [1]]
