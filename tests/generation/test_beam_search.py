"""Beam search against upstream's generate (sequences, sequences_scores, per-step scores, beam_indices) on a
left-padded batch, for llama and a mistral whose sliding window the prompt crosses (ring-buffer cache layers); the
cache reordered in place; the decode step compiled once; several sampled sequences per prompt."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from ..models.causal_lm_tester import count_graphs, generation_prompt
from ..test_generation import FALSE_ALARM, total_variation, tv_bound
from .conftest import VOCAB, Pair

NEW = 10


def early_token(pair: Pair, ids: torch.Tensor, mask: torch.Tensor) -> int:
    """A token that the best beam of the first prompt makes at its third step: as EOS, beams finish early."""
    out = pair.upstream.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=3, eos_token_id=None)
    return int(out[0, ids.shape[1] + 2])


def assert_same_beams(
    pair: Pair, ours_kwargs: dict[str, Any] | None = None, left_pads: tuple[int, ...] = (0, 4, 7), **kwargs: Any
) -> None:
    ids, mask = generation_prompt(VOCAB, left_pads)
    kwargs = dict(pad_token_id=0, return_dict_in_generate=True, output_scores=True, **kwargs)
    if "max_length" not in kwargs:
        kwargs["max_new_tokens"] = NEW
    if kwargs.get("eos_token_id") == "early":
        kwargs["eos_token_id"] = [early_token(pair, ids, mask), 2]
    theirs = pair.upstream.generate(ids, attention_mask=mask, **kwargs)
    ours = pair.ours.generate(ids, attention_mask=mask, **kwargs, **(ours_kwargs or {}))
    assert torch.equal(ours.sequences, theirs.sequences)
    assert ours.beam_indices.dtype == theirs.beam_indices.dtype
    assert torch.equal(ours.beam_indices, theirs.beam_indices)
    torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores, atol=1e-5, rtol=1e-6)
    assert len(ours.scores) == len(theirs.scores)
    for step_ours, step_theirs in zip(ours.scores, theirs.scores, strict=True):
        torch.testing.assert_close(step_ours, step_theirs, atol=1e-5, rtol=0)


BEAM_CASES = [
    dict(num_beams=3),
    dict(num_beams=4, num_return_sequences=3, length_penalty=0.5, eos_token_id="early"),
    dict(num_beams=3, early_stopping=True, eos_token_id="early"),
    dict(num_beams=2, early_stopping="never", length_penalty=2.0, eos_token_id="early"),
    dict(num_beams=3, early_stopping=False, length_penalty=-1.0, eos_token_id="early", repetition_penalty=1.5),
    dict(num_beams=2, max_length=16, eos_token_id="early", min_new_tokens=3, suppress_tokens=[7]),
]


@pytest.mark.parametrize("kwargs", BEAM_CASES, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_beam_search_equals_upstream(llama: Pair, kwargs: dict[str, Any]) -> None:
    assert_same_beams(llama, **kwargs)


def test_beam_search_with_token_order_processors_equals_upstream(llama: Pair) -> None:
    """no_repeat_ngram reads each beam's token order, which follows its beam at every reorder. Unpadded: upstream
    counts padding as text in this processor (see test_processors)."""
    assert_same_beams(llama, left_pads=(0, 0, 0), num_beams=3, no_repeat_ngram_size=2, eos_token_id="early")


def test_beam_search_equals_upstream_across_a_sliding_window(mistral: Pair) -> None:
    ring = dict(prefill_chunk_size=4, cache_bucket_size=64)  # rings of 8 slots beside 64 full-length ones
    assert_same_beams(mistral, ring, num_beams=3, num_return_sequences=2, eos_token_id="early")


def test_beam_search_on_the_dynamic_cache_equals_upstream(llama: Pair) -> None:
    assert_same_beams(llama, dict(cache_implementation="dynamic"), num_beams=3, eos_token_id="early")


def test_beam_search_reorders_the_cache_in_place(llama: Pair) -> None:
    """Every cache tensor keeps its address through a whole beam search (rows are copied, never reallocated)."""
    ids, mask = generation_prompt(VOCAB)
    llama.ours.generate(ids, attention_mask=mask, max_new_tokens=2, num_beams=3, pad_token_id=0)
    cache = llama.ours._generation_cache[1]
    addresses = [t.data_ptr() for t in (*cache.key_cache, *cache.value_cache, cache.key_positions)]
    llama.ours.generate(ids[:, 2:], attention_mask=mask[:, 2:], max_new_tokens=NEW, num_beams=3, pad_token_id=0)
    assert llama.ours._generation_cache[1] is cache
    assert [t.data_ptr() for t in (*cache.key_cache, *cache.value_cache, cache.key_positions)] == addresses


def test_beam_decode_compiles_once_for_any_prompt_length(llama: Pair) -> None:
    """A user's compiled forward: prefill chunk + decode step `[batch * beams, 1]` on the first call, nothing new
    on a call with another prompt length (dynamo's error_on_recompile would raise)."""
    ids, mask = generation_prompt(VOCAB)
    calls = [
        dict(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, num_beams=3, pad_token_id=0),
        dict(input_ids=ids[:, 3:], attention_mask=mask[:, 3:], max_new_tokens=8, num_beams=3, pad_token_id=0),
    ]
    counts, outputs = count_graphs(llama.ours, calls, then_no_recompile=True, backend="eager")
    assert counts[0] <= 2 and counts[1] == counts[0], counts
    expected = llama.upstream.generate(ids, attention_mask=mask, max_new_tokens=NEW, num_beams=3, pad_token_id=0)
    assert torch.equal(outputs[0], expected)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_beams=2, num_return_sequences=3), ValueError, "has to be smaller or equal to `num_beams`"),
        (dict(num_return_sequences=2), ValueError, "Greedy methods"),
        (dict(num_beams=2, early_stopping="sometimes"), ValueError, "early_stopping"),
        (dict(num_beams=2, do_sample=True), NotImplementedError, "do_sample=True.*beam sampling"),
        (dict(num_beams=2, num_beam_groups=2), NotImplementedError, "num_beam_groups=2 .group beam search"),
        (dict(num_beams=2, stop_strings="x"), NotImplementedError, "stop_strings='x'"),
        (dict(num_beams=2, max_time=5.0), NotImplementedError, "max_time=5.0"),
        (dict(num_beams=2, streamer=transformers.TextStreamer(None)), ValueError, "streamer"),
    ],
)
def test_beam_search_refusals_name_the_field(llama: Pair, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        llama.ours.generate(torch.tensor([[4, 5]]), max_new_tokens=2, **kwargs)


def test_sampled_sequences_are_grouped_per_prompt_and_independent(llama: Pair) -> None:
    """Prompt i's draws at rows i*n..i*n+n-1, as upstream lays them out; draws of one prompt differ."""
    ids, mask = generation_prompt(VOCAB)
    out = llama.ours.generate(
        ids, attention_mask=mask, max_new_tokens=8, do_sample=True, num_return_sequences=4, temperature=2.0
    )
    assert out.shape == (12, ids.shape[1] + 8)
    assert torch.equal(out[:, : ids.shape[1]], ids.repeat_interleave(4, dim=0))
    for prompt in range(3):
        assert out[4 * prompt : 4 * prompt + 4, ids.shape[1] :].unique(dim=0).shape[0] > 1


def test_sampled_sequences_follow_upstreams_distribution(llama: Pair) -> None:
    """One prompt, 10,000 sequences of one token each: their first tokens follow softmax of upstream's processed
    scores (total variation within the bound a correct sampler crosses with probability < 1e-9)."""
    prompt = torch.tensor([[5, 17, 33, 8, 41]])
    sampling = dict(do_sample=True, temperature=0.8, top_k=8, max_new_tokens=1, eos_token_id=None, pad_token_id=0)
    theirs = llama.upstream.generate(prompt, output_scores=True, return_dict_in_generate=True, **sampling)
    probs = theirs.scores[0][0].float().softmax(-1)
    draws = 10_000
    tokens = llama.ours.generate(
        prompt,
        num_return_sequences=draws,
        generator=torch.Generator().manual_seed(0),
        prefill_chunk_size=5,
        **sampling,
    )[:, -1]
    assert (probs[tokens] > 0).all()
    distance, categories = total_variation(tokens, probs)
    assert distance < tv_bound(categories, draws, FALSE_ALARM)
