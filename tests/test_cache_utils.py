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


# ---------------------------------------------------------------------- sliding-window rings
def gemma2_like(**kwargs) -> dict:
    """Alternating sliding (window 4) and full layers, as upstream's Gemma2 lays them out."""
    sizes = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4, num_hidden_layers=4)
    return {**sizes, "sliding_window": 4, **kwargs}


def test_sliding_layers_get_a_ring_of_window_plus_chunk_slots() -> None:
    """Gemma2 alternates kinds, Qwen2 slides above max_window_layers, Mistral slides everywhere: each sliding layer
    holds W - 1 + chunk slots (never written: -1), each full layer max_cache_len; a ring no shorter than the cache
    is not kept as a ring."""
    from transformers_static import Gemma2Config, MistralConfig, Qwen2Config

    cache = StaticCache(Gemma2Config(**gemma2_like()), max_batch_size=2, max_cache_len=16, prefill_chunk_size=3)
    assert [tuple(k.shape) for k in cache.key_cache] == [(2, 2, 6, 4), (2, 2, 16, 4)] * 2
    assert cache.layer_windows == [4, None, 4, None] and cache.ring_windows == {"sliding_attention": 4}
    assert cache.ring_cache_positions["sliding_attention"].tolist() == [-1] * 6
    assert [k.shape[2] for k in StaticCache(Gemma2Config(**gemma2_like()), 1, 6, prefill_chunk_size=3).key_cache] == [
        6
    ] * 4
    qwen2 = Qwen2Config(**gemma2_like(), use_sliding_window=True, max_window_layers=3)
    assert [k.shape[2] for k in StaticCache(qwen2, 1, 64).key_cache] == [64] * 3 + [35]  # default chunk: 32
    mistral = MistralConfig(**gemma2_like())
    assert [k.shape[2] for k in StaticCache(mistral, 1, 64, prefill_chunk_size=1).key_cache] == [4] * 4


def test_rings_cache_this_ranks_kv_heads_under_tensor_parallel() -> None:
    from transformers_static import Gemma2Config

    config = Gemma2Config(**gemma2_like())
    config._tp_size, config._tp_rank = 2, 1
    assert [tuple(k.shape) for k in StaticCache(config, 1, 16, prefill_chunk_size=3).key_cache] == [
        (1, 1, 6, 4),
        (1, 1, 16, 4),
    ] * 2


def ring_cache() -> StaticCache:
    """Window 4, room for chunks of 3: a ring of 6 slots on layers 0 and 2."""
    from transformers_static import Gemma2Config

    return StaticCache(Gemma2Config(**gemma2_like()), max_batch_size=1, max_cache_len=32, prefill_chunk_size=3)


def write(cache: StaticCache, positions: list[int], layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Write tokens whose keys are their positions (as the model's forward does: positions, then layers)."""
    cache_position = torch.tensor(positions)
    cache.update_ring_positions(cache_position)
    states = cache_position.float()[None, None, :, None].expand(1, 2, len(positions), 4)
    return cache.update(states, -states, layer, cache_position)


def test_ring_writes_position_p_to_slot_p_mod_slots() -> None:
    cache = ring_cache()
    address = cache.key_cache[0].data_ptr()
    for start in range(0, 9, 3):  # chunks of the room: written in place
        keys, _ = write(cache, list(range(start, start + 3)))
        assert keys.shape == (1, 2, 6, 4) and keys.data_ptr() == address
    assert keys[0, 0, :, 0].tolist() == [6, 7, 8, 3, 4, 5]
    assert cache.ring_cache_positions["sliding_attention"].tolist() == [6, 7, 8, 3, 4, 5]
    keys, _ = write(cache, [9])
    assert keys[0, 0, :, 0].tolist() == [6, 7, 8, 9, 4, 5]


def test_more_tokens_than_the_room_attend_the_ring_then_themselves() -> None:
    """4 new tokens (room 3): attention sees the ring as it was, then the new states (upstream's
    StaticSlidingWindowLayer); the ring keeps them. 8 (more than the ring): it keeps the last 6."""
    cache = ring_cache()
    write(cache, [0, 1, 2])
    before = cache.ring_key_positions(torch.arange(3, 7))["sliding_attention"]
    assert before.tolist() == [0, 1, 2, -1, -1, -1, 3, 4, 5, 6]
    keys, values = write(cache, [3, 4, 5, 6])
    assert keys.shape == (1, 2, 10, 4) and keys[0, 0, :, 0].tolist() == [0, 1, 2, 0, 0, 0, 3, 4, 5, 6]
    assert torch.equal(values, -keys)
    assert cache.key_cache[0][0, 0, :, 0].tolist() == [6, 1, 2, 3, 4, 5]
    keys, _ = write(cache, list(range(7, 15)))
    assert keys.shape == (1, 2, 14, 4)
    assert cache.key_cache[0][0, 0, :, 0].tolist() == [12, 13, 14, 9, 10, 11]
    assert cache.ring_cache_positions["sliding_attention"].tolist() == [12, 13, 14, 9, 10, 11]


def test_ring_positions_are_computed_before_and_recorded_apart() -> None:
    """What a forward's masks read (the ring after the write; stale copies of positions written again hidden) is
    computed without writing; only update_ring_positions records it."""
    cache = ring_cache()
    write(cache, [0, 1, 2])
    assert cache.ring_key_positions(torch.tensor([3]))["sliding_attention"].tolist() == [0, 1, 2, 3, -1, -1]
    assert cache.ring_cache_positions["sliding_attention"].tolist() == [0, 1, 2, -1, -1, -1]
    again = cache.ring_key_positions(torch.arange(1, 5))["sliding_attention"]  # 4 tokens: over the room
    assert again.tolist() == [0, -1, -1, -1, -1, -1, 1, 2, 3, 4]


def test_two_tokens_of_one_forward_in_one_ring_slot_are_refused() -> None:
    cache = ring_cache()
    with pytest.raises(ValueError, match=r"writes two tokens to one slot of the sliding_attention layers' ring \(6"):
        cache.validate(1, torch.tensor([1, 7]))
    cache.validate(1, torch.arange(7, 13))  # six distinct slots


def test_reset_forgets_the_rings() -> None:
    cache = ring_cache()
    write(cache, [0, 1, 2])
    cache.reset()
    assert cache.ring_cache_positions["sliding_attention"].tolist() == [-1] * 6
    assert not cache.key_cache[0].any()


@pytest.mark.parametrize("config_name", ["Gemma2Config", "MistralConfig"])
def test_seq_length_of_ring_caches_counts_like_upstream(config_name: str) -> None:
    """Gemma2 (a full layer to count) and Mistral (rings only), 3 then 12 tokens: upstream counts the tokens."""
    import transformers_static

    kwargs = gemma2_like()
    ours = StaticCache(getattr(transformers_static, config_name)(**kwargs), 1, 32, prefill_chunk_size=3)
    theirs = transformers.StaticCache(config=getattr(transformers, config_name)(**kwargs), max_cache_len=32)
    for positions in (torch.arange(3), torch.arange(3, 15)):
        ours.update_ring_positions(positions)
        for layer in range(4):
            fill = states(1, len(positions), 1.0)
            ours.update(fill, fill, layer, positions)
            theirs.update(fill, fill, layer, cache_kwargs={"cache_position": positions})
        assert ours.get_seq_length() == int(theirs.get_seq_length()) == positions[-1] + 1


def test_ring_cache_bytes_against_upstream_at_8192() -> None:
    """Gemma2-like at max_cache_len 8192 (window 4096, chunk 32): the sliding layers hold 4096 + 31 slots
    (upstream: 4096), the full ones 8192; both far below full length everywhere."""
    from transformers_static import Gemma2Config

    kwargs = gemma2_like(sliding_window=4096, num_hidden_layers=6)
    ours = StaticCache(Gemma2Config(**kwargs), 1, 8192, dtype=torch.bfloat16, device="meta")
    theirs = transformers.StaticCache(config=transformers.Gemma2Config(**kwargs), max_cache_len=8192)
    theirs.early_initialization(1, 2, 4, torch.bfloat16, torch.device("meta"))
    slot = 2 * 2 * 4 * 2  # keys and values, kv_heads, head_dim, bf16 bytes
    ours_bytes = sum(t.numel() * t.element_size() for t in (*ours.key_cache, *ours.value_cache))
    theirs_bytes = sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in theirs.layers)
    assert theirs_bytes == 3 * (4096 + 8192) * slot
    assert ours_bytes == theirs_bytes + 3 * 31 * slot
    assert ours_bytes < 0.76 * 6 * 8192 * slot


# ---------------------------------------------------------------- per-row cache positions (serving slots)
def test_per_row_cache_position_writes_each_rows_own_slots() -> None:
    cache = StaticCache(CONFIG, max_batch_size=3, max_cache_len=5)
    new = torch.arange(1.0, 4.0)[:, None, None, None].expand(3, 2, 1, 4)  # row r writes r + 1
    keys, values = cache.update(new, -new, 0, torch.tensor([[4], [0], [2]]))  # [batch, q_len]
    assert keys[:, 0, :, 0].tolist() == [[0, 0, 0, 0, 1], [2, 0, 0, 0, 0], [0, 0, 3, 0, 0]]
    assert values[:, 1, :, 0].tolist() == [[0, 0, 0, 0, -1], [-2, 0, 0, 0, 0], [0, 0, -3, 0, 0]]
    positions = cache.update_positions(torch.tensor([[7], [8], [9]]), torch.tensor([[4], [0], [2]]))
    assert positions.tolist() == [[0, 0, 0, 0, 7], [8, 0, 0, 0, 0], [0, 0, 9, 0, 0]]


def test_rows_view_writes_and_attends_only_its_rows() -> None:
    cache = StaticCache(CONFIG, max_batch_size=3, max_cache_len=4)
    view = cache.rows(torch.tensor([2]))
    keys, values = view.update(states(1, 2, 5.0), states(1, 2, 6.0), 1, torch.tensor([1, 2]))
    assert keys.shape == (1, 2, 4, 4) and keys[0, 0, :, 0].tolist() == [0, 5, 5, 0]
    assert cache.key_cache[1][2, 1, :, 0].tolist() == [0, 5, 5, 0] and cache.key_cache[1][:2].abs().sum() == 0
    assert cache.value_cache[1][2, 0, :, 3].tolist() == [0, 6, 6, 0] and cache.key_cache[0].abs().sum() == 0
    view.rows.fill_(0)  # the same view, another row: set in place
    view.update(states(1, 1, 7.0), states(1, 1, 7.0), 1, torch.tensor([[3]]))
    assert cache.key_cache[1][0, 0, :, 0].tolist() == [0, 0, 0, 7]
    assert view.update_positions(torch.tensor([[4]]), torch.tensor([3])).tolist() == [[0, 0, 0, 4]]
    assert cache.key_positions[1:].abs().sum() == 0
    with pytest.raises(ValueError, match=r"rows \[3\] outside the StaticCache's 3 rows"):
        cache.rows(torch.tensor([3])).validate(1, torch.tensor([0]))


def test_per_row_positions_are_refused_on_ring_caches() -> None:
    cache = ring_cache()
    with pytest.raises(ValueError, match=r"per-row cache_position \[1, 1\] \[batch, q_len\] needs full-length"):
        cache.ring_key_positions(torch.tensor([[3]]))
    with pytest.raises(ValueError, match="StaticCache.rows needs full-length slots"):
        cache.rows(torch.tensor([0]))


@pytest.mark.parametrize("model_name", ["llama", "bloom"])
def test_per_row_decode_matches_each_row_run_alone(model_name: str) -> None:
    """Rows at different lengths decode in one forward (per-row cache positions; Bloom: per-row ALiBi key
    positions), each as if run alone; prefills go in through the rows view."""
    import transformers_static as ts

    torch.manual_seed(0)
    if model_name == "llama":
        config = LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2,
        )  # fmt: skip
        model = ts.LlamaForCausalLM(config).eval()
    else:
        config = ts.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
        model = ts.BloomForCausalLM(config).eval()
    prompts = [torch.randint(0, 64, (n,)) for n in (5, 2, 7)]
    cache = StaticCache(config, max_batch_size=3, max_cache_len=10)
    view = cache.rows(torch.zeros(1, dtype=torch.long))
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            view.rows.fill_(row)
            model(prompt[None], past_key_values=view, cache_position=torch.arange(len(prompt)))
        step = torch.tensor([[3], [4], [5]])
        together = model(step, past_key_values=cache, cache_position=torch.tensor([[5], [2], [7]])).logits
        for row, prompt in enumerate(prompts):
            alone = StaticCache(config, max_batch_size=1, max_cache_len=10)
            ids = torch.cat([prompt, step[row]])[None]
            expected = model(ids, past_key_values=alone, cache_position=torch.arange(ids.shape[1])).logits[:, -1]
            torch.testing.assert_close(together[row], expected, atol=1e-5, rtol=1e-5)


def test_per_row_cache_position_needs_a_static_cache_and_the_batch() -> None:
    import transformers_static as ts

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = ts.LlamaForCausalLM(config).eval()
    ids = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(ValueError, match=r"cache_position must have shape \[1\] \(q_len\), got \[2, 1\]"):
        model(ids, past_key_values=DynamicCache(), cache_position=torch.tensor([[0], [1]]))
    cache = StaticCache(config, max_batch_size=2, max_cache_len=4)
    with pytest.raises(ValueError, match=r"or \[2, 1\] \(batch, q_len\) with a StaticCache, got \[3, 1\]"):
        model(ids, past_key_values=cache, cache_position=torch.tensor([[0], [1], [2]]))
    with pytest.raises(ValueError, match="cache_position reaches 4, past the StaticCache's max_cache_len 4"):
        model(ids, past_key_values=cache, cache_position=torch.tensor([[0], [4]]))
    assert cache.key_cache[0].abs().sum() == 0  # refused before any write


class _KeyOnlyConfig(LlamaConfig):
    """Latent attention's layout: one key "head" of 6 per token and layer, no value slots (value width 0)."""

    def kv_cache_shape(self, layer_idx: int) -> tuple[int, int, int]:
        return 1, 6, 0


def test_a_key_only_layer_keeps_no_value_slots() -> None:
    config = _KeyOnlyConfig(hidden_size=16, num_attention_heads=4, num_hidden_layers=2)
    static = StaticCache(config, max_batch_size=2, max_cache_len=5)
    assert [tuple(k.shape) for k in static.key_cache] == [(2, 1, 5, 6)] * 2 and static.value_cache == [None, None]
    key = torch.arange(12.0).view(1, 1, 2, 6)
    keys, values = static.update(key, None, 1, torch.tensor([1, 3]))
    assert values is None and keys.shape == (1, 1, 5, 6) and keys.data_ptr() == static.key_cache[1].data_ptr()
    assert torch.equal(keys[0, 0, [1, 3]], key[0, 0]) and not keys[0, 0, [0, 2, 4]].any()
    per_row, _ = static.update(key.expand(2, -1, -1, -1), None, 0, torch.tensor([[0, 1], [2, 3]]))  # [batch, q_len]
    assert torch.equal(per_row[1, 0, [2, 3]], key[0, 0])
    rows, values = static.rows(torch.tensor([1])).update(key[:, :, :1], None, 0, torch.tensor([4]))
    assert values is None and rows.shape == (1, 1, 5, 6) and torch.equal(static.key_cache[0][1, 0, 4], key[0, 0, 0])
    static.reset()
    assert not any(k.any() for k in static.key_cache)
    dynamic = DynamicCache()
    dynamic.update(key, None, 0, torch.arange(2))
    keys, values = dynamic.update(key[:, :, :1], None, 0, torch.tensor([2]))
    assert values is None and keys.shape == (1, 1, 3, 6) and dynamic.get_seq_length() == 3


def test_layers_with_keys_and_values_keep_both_slots() -> None:
    """A `(kv_heads, head_dim)` layer (every model but latent attention's) keeps equal key and value slots."""
    cache = StaticCache(CONFIG, max_batch_size=1, max_cache_len=3)
    assert [tuple(v.shape) for v in cache.value_cache] == [(1, 2, 3, 4)] * 2
