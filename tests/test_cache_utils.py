"""DynamicCache and StaticCache: what they store, and the errors raised before any write."""

import pytest
import torch
import transformers

from transformers_static import DynamicCache, LlamaConfig, StaticCache

CONFIG = LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)


def states(batch: int, q_len: int, fill: float) -> torch.Tensor:
    return torch.full((batch, 2, q_len, 4), fill)  # [batch, kv_heads, q_len, head_dim]


def test_static_cache_is_allocated_once_with_fixed_shapes() -> None:
    cache = StaticCache(CONFIG, max_batch_size=2, max_cache_len=6)
    assert [tuple(k.shape) for k in cache.key_cache] == [(2, 2, 6, 4)] * 2
    address = cache.key_cache[0].data_ptr()
    keys, values = cache.update(states(2, 2, 1.0), states(2, 2, -1.0), 0, torch.tensor([3, 4]))
    assert keys.shape == (2, 2, 6, 4) and keys.data_ptr() == address
    assert keys[0, 0, :, 0].tolist() == [0, 0, 0, 1, 1, 0]
    assert values[1, 1, :, 0].tolist() == [0, 0, 0, -1, -1, 0]


def test_static_cache_serves_a_smaller_batch() -> None:
    cache = StaticCache(CONFIG, max_batch_size=3, max_cache_len=4)
    keys, _ = cache.update(states(1, 1, 5.0), states(1, 1, 5.0), 1, torch.tensor([0]))
    assert (
        keys.shape == (1, 2, 4, 4) and cache.key_cache[1][0, 0, 0, 0] == 5 and cache.key_cache[1][1].abs().sum() == 0
    )


def test_static_cache_overflow_and_batch_errors() -> None:
    cache = StaticCache(CONFIG, max_batch_size=2, max_cache_len=4)
    with pytest.raises(ValueError, match=r"cache_position reaches 4, past the StaticCache's max_cache_len 4"):
        cache.validate(2, torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="batch size 3 is larger than the StaticCache's max_batch_size 2"):
        cache.validate(3, torch.tensor([0]))
    with pytest.raises(ValueError, match="max_cache_len >= 1"):
        StaticCache(CONFIG, max_batch_size=1, max_cache_len=0)


def test_dynamic_cache_concatenates() -> None:
    cache = DynamicCache()
    cache.update(states(1, 3, 1.0), states(1, 3, 1.0), 0, torch.arange(3))
    keys, _ = cache.update(states(1, 1, 2.0), states(1, 1, 2.0), 0, torch.tensor([3]))
    assert keys[0, 0, :, 0].tolist() == [1, 1, 1, 2]
    assert cache.get_seq_length() == 4 and cache.kv_len(1) == 5


def test_key_positions_follow_the_writes() -> None:
    """What ALiBi reads: each key slot's position, as written (packed rows restart at 0)."""
    static = StaticCache(CONFIG, max_batch_size=2, max_cache_len=5)
    static.update_positions(torch.tensor([[0, 1, 0], [0, 1, 2]]), torch.arange(3))
    positions = static.update_positions(torch.tensor([[1], [3]]), torch.tensor([3]))
    assert positions.tolist() == [[0, 1, 0, 1, 0], [0, 1, 2, 3, 0]]
    dynamic = DynamicCache()
    dynamic.update_positions(torch.tensor([[0, 1, 0]]), torch.arange(3))
    assert dynamic.update_positions(torch.tensor([[1]]), torch.tensor([3])).tolist() == [[0, 1, 0, 1]]


def test_static_cache_reset_zeroes_in_place() -> None:
    cache = StaticCache(CONFIG, max_batch_size=1, max_cache_len=4)
    address = cache.key_cache[0].data_ptr()
    cache.update(states(1, 2, 3.0), states(1, 2, 3.0), 0, torch.arange(2))
    cache.update_positions(torch.tensor([[5, 6]]), torch.arange(2))
    cache.reset()
    assert cache.key_cache[0].data_ptr() == address
    assert not any(t.any() for t in (*cache.key_cache, *cache.value_cache, cache.key_positions))


def test_static_cache_seq_length_counts_written_slots_like_upstream() -> None:
    ours = StaticCache(CONFIG, max_batch_size=1, max_cache_len=6)
    theirs = transformers.StaticCache(config=transformers.LlamaConfig(**CONFIG.to_dict()), max_cache_len=6)
    assert ours.get_seq_length() == 0
    for layer in range(2):
        ours.update(states(1, 3, 1.0), states(1, 3, 1.0), layer, torch.arange(3))
        theirs.update(states(1, 3, 1.0), states(1, 3, 1.0), layer, cache_kwargs={"cache_position": torch.arange(3)})
    assert ours.get_seq_length() == int(theirs.get_seq_length()) == 3
