"""Sliding-window layers on a StaticCache ring of `W - 1 + chunk` slots, against upstream transformers: Mistral
(every layer sliding), Qwen2 (full layers below max_window_layers) and Gemma2 (alternating, soft-capped).

Each checkpoint is tiny, its weights perturbed. The caches here leave room for chunks of CHUNK tokens in a cache of
MAX_LEN, so every ring is far shorter than the cache: prompts written in chunks shorter than, equal to and one past
the room, or all at once (more tokens than the ring has slots), then decoded past the window; 4D masks over cache
positions; packed sequences; keys the ring dropped; greedy generate past the window (lengths a multiple of the
window and one off), with the user's own compile; no host read in generate's steps; regional compilation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch._dynamo
import transformers
from torch._dynamo.testing import EagerAndRecordGraphs

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.generation.compilation import compile_forward

from .models.causal_lm_tester import count_graphs, generation_prompt, padding_mask, perturb, positions, reference_4d

VOCAB, CHUNK, MAX_LEN, ATOL = 64, 5, 64, 1e-5
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2)
CONFIGS = {
    "mistral": transformers.MistralConfig(**SIZES, num_hidden_layers=2, sliding_window=4),
    "qwen2": transformers.Qwen2Config(
        **SIZES, num_hidden_layers=4, use_sliding_window=True, max_window_layers=2, sliding_window=3
    ),
    "gemma2": transformers.Gemma2Config(
        **SIZES, num_hidden_layers=2, head_dim=8, sliding_window=3, attn_logit_softcapping=2.0
    ),  # soft-capped: eager only
}
KERNELS = {"mistral": "sdpa", "qwen2": "sdpa", "gemma2": "eager"}
PADS = [0, 3, 9]


@dataclass
class Pair:
    name: str
    upstream: transformers.PreTrainedModel
    ours: torch.nn.Module

    @property
    def windows(self) -> dict[str, int | None]:
        return {kind: c.sliding_window for kind, c in self.ours.model.mask_converters.items()}

    def cache(self, batch: int = 3, chunk: int = CHUNK) -> StaticCache:
        cache = StaticCache(self.ours.config, batch, MAX_LEN, prefill_chunk_size=chunk)
        assert cache.ring_windows  # the sliding layers are rings
        return cache

    def reference(self, ids: torch.Tensor, mask_2d: torch.Tensor) -> torch.Tensor:
        """Upstream's logits for the whole sequence in one forward, without a cache."""
        with torch.no_grad():
            return self.upstream(ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits

    def masks(self, build: Callable[[int | None], torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        """`build(window)` for each kind: a dict by kind, or the one mask of a single-kind model."""
        masks = {kind: build(window) for kind, window in self.windows.items()}
        return masks if len(masks) > 1 else next(iter(masks.values()))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    torch.manual_seed(0)
    upstream = perturb(transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param]).eval(), 0.1)
    path = str(tmp_path_factory.mktemp(request.param))
    upstream.save_pretrained(path)
    upstream.set_attn_implementation(KERNELS[request.param])
    ours = AutoModelForCausalLM.from_pretrained(path, attn_implementation=KERNELS[request.param])
    return Pair(request.param, upstream, ours)


def sequence(length: int, pads: list[int] = PADS) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (len(pads), length), generator=torch.Generator().manual_seed(4))
    return ids, padding_mask(pads, length)


def rows(masks: torch.Tensor | dict[str, torch.Tensor], start: int, end: int) -> torch.Tensor | dict:
    if isinstance(masks, dict):
        return {kind: mask[:, :, start:end] for kind, mask in masks.items()}
    return masks[:, :, start:end]


def spans(prefill: int, chunk: int, total: int) -> list[tuple[int, int]]:
    """`prefill` tokens in forwards of `chunk`, then one token at a time up to `total`."""
    return [(s, min(s + chunk, prefill)) for s in range(0, prefill, chunk)] + [
        (t, t + 1) for t in range(prefill, total)
    ]


def run(
    pair: Pair, cache: StaticCache, ids: torch.Tensor, mask_for: Callable, steps: list[tuple[int, int]]
) -> torch.Tensor:
    """Forwards over `steps` of (start, end) into `cache`; the concatenated logits."""
    mask_2d = padding_mask(PADS, ids.shape[1])
    logits = []
    with torch.no_grad():
        for start, end in steps:
            out = pair.ours(
                ids[:, start:end],
                attention_mask=mask_for(start, end),
                position_ids=positions(mask_2d)[:, start:end],
                past_key_values=cache,
                cache_position=torch.arange(start, end),
            )
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


def assert_close_on_real_tokens(ours: torch.Tensor, theirs: torch.Tensor, mask_2d: torch.Tensor) -> None:
    real = mask_2d.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=0)


# ---------------------------------------------------------------------- forwards into a ring
@pytest.mark.parametrize("chunk", [1, CHUNK, CHUNK + 1, 30], ids=["decode", "room", "room+1", "all_at_once"])
def test_prefill_of_any_length_then_decode_past_the_window_matches_upstream(pair: Pair, chunk: int) -> None:
    """A left-padded 30-token prompt written `chunk` tokens at a time (within the ring's room, one past it: the
    ring then new states are attended, as upstream's StaticSlidingWindowLayer; all at once: more tokens than the
    ring's slots, of which it keeps the last), then 10 decode steps: upstream's logits, 2D masks."""
    ids, mask_2d = sequence(40)
    logits = run(pair, pair.cache(), ids, lambda start, end: mask_2d[:, :end], spans(30, chunk, 40))
    assert_close_on_real_tokens(logits, pair.reference(ids, mask_2d), mask_2d)


@pytest.mark.parametrize("kind", ["4d_bool", "4d_additive"])
def test_4d_masks_over_cache_positions_match_upstream(pair: Pair, kind: str) -> None:
    """A user's 4D masks `[batch, 1, q_len, max_cache_len]` (one per layer kind) over cache positions, read at each
    ring slot's position: 12 tokens (past the room), a chunk of 5 (the room), then 6 decode steps."""
    ids, mask_2d = sequence(23)
    masks = pair.masks(lambda window: reference_4d(mask_2d, kind, MAX_LEN, window))
    steps = [(0, 12), (12, 17), *((t, t + 1) for t in range(17, 23))]
    logits = run(pair, pair.cache(), ids, lambda start, end: rows(masks, start, end), steps)
    assert_close_on_real_tokens(logits, pair.reference(ids, mask_2d), mask_2d)


def snapshot(cache: StaticCache) -> list[torch.Tensor]:
    return [t.clone() for t in (*cache.key_cache, *cache.value_cache, *cache.ring_cache_positions.values())]


def test_masks_needing_keys_the_ring_dropped_are_refused_before_any_write(pair: Pair) -> None:
    """After 20 tokens, a full-causal 4D mask for every kind, or a query sent back to position 5, would need keys the
    ring has overwritten: a ValueError naming them, the cache untouched."""
    ids, mask_2d = sequence(21)
    cache = pair.cache()
    run(pair, cache, ids, lambda start, end: mask_2d[:, :end], [(0, 20)])
    before = snapshot(cache)
    causal = reference_4d(mask_2d, "4d_bool", MAX_LEN)[:, :, 20:21]
    with torch.no_grad(), pytest.raises(ValueError, match=r"cache positions \[0, 1, 2, .*does not hold"):
        pair.ours(ids[:, 20:], attention_mask=causal, past_key_values=cache, cache_position=torch.tensor([20]))
    with torch.no_grad(), pytest.raises(ValueError, match=r"cache positions \[(\d, )*4\] .*sliding_attention"):
        pair.ours(ids[:, 5:6], attention_mask=mask_2d[:, :6], past_key_values=cache, cache_position=torch.tensor([5]))
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(cache), strict=True))


def test_packed_sequences_in_a_ring_match_upstream_on_each_sequence(pair: Pair) -> None:
    """Two sequences longer than the window in one row, written at once (past the ring's room) with block-diagonal
    4D masks and positions restarting, then the second continued by a token: each is upstream's alone."""
    first, second = sequence(11, [0])[0][0], sequence(14, [0])[0][0]
    segment = torch.tensor([0] * 11 + [1] * 14)  # positions 0..24, the last one decoded
    same = segment[:, None] == segment[None, :]
    same = torch.nn.functional.pad(same, (0, MAX_LEN - 25))  # [25, MAX_LEN]

    def packed(window: int | None) -> torch.Tensor:
        return reference_4d(torch.ones(1, 25, dtype=torch.long), "4d_bool", MAX_LEN, window) & same

    masks = pair.masks(packed)
    position_ids = torch.cat([torch.arange(11), torch.arange(14)])[None]
    cache = pair.cache(batch=1)
    tokens = torch.cat([first, second])[None]
    with torch.no_grad():
        outs = [
            pair.ours(
                tokens[:, start:end],
                attention_mask=rows(masks, start, end),
                position_ids=position_ids[:, start:end],
                past_key_values=cache,
                cache_position=torch.arange(start, end),
            ).logits[0]
            for start, end in [(0, 24), (24, 25)]
        ]
        alone = [pair.upstream(seq[None]).logits[0] for seq in (first, second)]
    torch.testing.assert_close(torch.cat(outs), torch.cat(alone), atol=ATOL, rtol=0)


# ---------------------------------------------------------------------- generate
def window_of(pair: Pair) -> int:
    return next(window for window in pair.windows.values() if window is not None)


@pytest.mark.parametrize(
    ("prompt_extra", "new_extra"), [(0, 0), (1, -1), (-1, 1)], ids=["multiples", "prompt_one_over", "prompt_one_under"]
)
def test_greedy_generate_past_the_window_matches_upstream(pair: Pair, prompt_extra: int, new_extra: int) -> None:
    """Prompts and generations longer than the window, their lengths a multiple of it (2W, 3W) or one off
    (2W + 1 and 3W - 1, 2W - 1 and 3W + 1), left-padded, chunks of 4 in buckets of 16: rings of W + 3 slots."""
    window = window_of(pair)
    prompt_len, new_tokens = 2 * window + prompt_extra, 3 * window + new_extra
    ids, mask = generation_prompt(VOCAB, left_pads=(0, 1, 3), length=prompt_len)
    kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=None)
    ours = pair.ours.generate(ids, prefill_chunk_size=4, cache_bucket_size=16, **kwargs)
    cache = pair.ours._generation_cache[1]
    rings = [k.shape[2] for k, w in zip(cache.key_cache, cache.layer_windows, strict=True) if w is not None]
    assert rings and set(rings) == {window + 3} and window + 3 < cache.max_cache_len
    expected = pair.upstream.generate(ids, do_sample=False, pad_token_id=0, **kwargs)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)


def test_compiled_generate_into_a_users_decode_only_ring_matches_upstream(pair: Pair) -> None:
    """A user's StaticCache with room for one token (rings of exactly W slots, upstream's size), reused by two calls
    of the user's own compile: generate's chunks of 4 attend ring then new states; two graphs, then none; tokens
    are upstream's."""
    cache = StaticCache(pair.ours.config, 3, 32, prefill_chunk_size=1)
    assert [k.shape[2] for k, w in zip(cache.key_cache, cache.layer_windows, strict=True) if w] == [
        window_of(pair)
    ] * sum(w is not None for w in cache.layer_windows)
    ids, mask = generation_prompt(VOCAB, left_pads=(0, 2, 5), length=10)
    calls = [
        dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None),
        dict(input_ids=ids[:, 2:], attention_mask=mask[:, 2:], max_new_tokens=9, eos_token_id=None),
    ]
    for call in calls:
        call.update(past_key_values=cache, prefill_chunk_size=4)
    counts, outputs = count_graphs(pair.ours, calls, then_no_recompile=True)
    assert counts == [2, 2]
    for call, got in zip(calls, outputs, strict=True):
        expected = pair.upstream.generate(
            call["input_ids"], attention_mask=call["attention_mask"], max_new_tokens=call["max_new_tokens"],
            eos_token_id=None, do_sample=False, pad_token_id=0,
        )  # fmt: skip
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("pair", ["qwen2"], indirect=True)  # both kinds
def test_generate_steps_read_nothing_back_with_rings(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ring positions, masks and writes are device work: no host read in generate's prefill and decode forwards."""
    reads: list[str] = []
    forwards: list[int] = []
    base = pair.ours.model.forward

    def counted(*args, **kwargs):
        start = len(reads)
        try:
            return base(*args, **kwargs)
        finally:
            forwards.append(len(reads) - start)

    def recorded(name: str):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            reads.append(name)
            return original(self, *args, **kwargs)

        return read

    ids, mask = generation_prompt(VOCAB, length=14)
    with monkeypatch.context() as patch:
        patch.setattr(pair.ours.model, "forward", counted)
        for name in ("__bool__", "tolist", "item", "__int__"):
            patch.setattr(torch.Tensor, name, recorded(name))
        pair.ours.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None, prefill_chunk_size=4)
    assert pair.ours._generation_cache[1].ring_windows
    assert len(forwards) == 4 + 7 and forwards == [0] * len(forwards)


@pytest.mark.parametrize("pair", ["mistral", "qwen2"], indirect=True)  # rings only; both layouts
def test_regional_compilation_gives_one_body_per_slot_layout(pair: Pair) -> None:
    """Regional compilation with rings: one graph for the step; every layer calls a compiled body, one per slot
    layout (a ring, the full length); tokens are eager's."""
    ids, mask = generation_prompt(VOCAB, length=9)
    kwargs = dict(attention_mask=mask, max_new_tokens=9, eos_token_id=None, prefill_chunk_size=4)
    expected = pair.ours.generate(ids, **kwargs)
    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    pair.ours._compiled_forwards = {"regional": compile_forward(pair.ours, "regional", backend=backend)}
    try:
        got = pair.ours.generate(ids, compile="regional", **kwargs)
    finally:
        pair.ours._compiled_forwards = None
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    (graph,) = backend.graphs
    calls = [node for node in graph.graph.nodes if node.target is torch.ops.higher_order.invoke_subgraph]
    cache = pair.ours._generation_cache[1]
    layouts = {(k.shape, window) for k, window in zip(cache.key_cache, cache.layer_windows, strict=True)}
    assert len(calls) == pair.ours.config.num_hidden_layers
    assert len({node.args[0].target for node in calls}) == len(layouts) == (2 if pair.name == "qwen2" else 1)


@pytest.mark.parametrize("chunk", [CHUNK, CHUNK + 1], ids=["room", "room+1"])
def test_positions_written_again_replace_their_keys(pair: Pair, chunk: int) -> None:
    """20 tokens, then the last 4 positions written again with other tokens (a chunk within the ring's room, or one
    past it): attention sees only the new keys of those positions (the ring's old copies are stale)."""
    ids, mask_2d = sequence(16 + chunk)
    cache = pair.cache()
    other = torch.randint(3, VOCAB, (3, 20), generator=torch.Generator().manual_seed(5))
    run(pair, cache, torch.cat([ids[:, :16], other[:, 16:]], dim=1), lambda start, end: mask_2d[:, :end], [(0, 20)])
    logits = run(pair, cache, ids, lambda start, end: mask_2d[:, :end], [(16, 16 + chunk)])
    reference = pair.reference(ids, mask_2d)[:, 16:]
    assert_close_on_real_tokens(logits, reference, mask_2d[:, 16:])
