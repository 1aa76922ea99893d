"""Prompt-lookup decoding: token-identical to plain greedy (and to upstream's prompt lookup) on a copy-heavy prompt,
with drafts really accepted; across a sliding window on ring caches; at most the prefill and the verify graph
compiled, none on a second call; n-gram lookup as upstream's; refusals naming the field."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from transformers_static.generation.candidate_generator import lookup_candidates

from ..models.causal_lm_tester import count_graphs
from .conftest import Pair, candidate_stats

GREEDY = dict(eos_token_id=None, pad_token_id=0)


def copy_heavy_prompt(model: Any) -> torch.Tensor:
    """The model's own greedy text, then its first 24 new tokens again: what follows is mostly a copy."""
    greedy = model.generate(torch.tensor([[5, 6, 7, 8, 9, 10]]), max_new_tokens=40, **GREEDY)
    return torch.cat([greedy, greedy[:, 6:30]], dim=1)


def test_prompt_lookup_equals_greedy_and_upstream(llama: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = copy_heavy_prompt(llama.ours)
    stats = candidate_stats(monkeypatch)
    ours = llama.ours.generate(prompt, max_new_tokens=30, prompt_lookup_num_tokens=5, **GREEDY)
    assert torch.equal(ours, llama.ours.generate(prompt, max_new_tokens=30, **GREEDY))
    theirs = llama.upstream.generate(prompt, max_new_tokens=30, prompt_lookup_num_tokens=5, **GREEDY)
    assert torch.equal(ours, theirs)
    assert stats["accepted"] > 0 and stats["verify_steps"] < 30  # drafts were taken: fewer forwards than tokens


def test_prompt_lookup_stops_at_eos_as_greedy(llama: Pair) -> None:
    prompt = copy_heavy_prompt(llama.ours)
    greedy = llama.ours.generate(prompt, max_new_tokens=30, **GREEDY)
    eos = int(greedy[0, prompt.shape[1] + 9])  # first made at step <= 9
    kwargs = dict(max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
    expected = llama.ours.generate(prompt, **kwargs)
    assert expected.shape[1] < greedy.shape[1]
    assert torch.equal(llama.ours.generate(prompt, prompt_lookup_num_tokens=4, **kwargs), expected)


def test_prompt_lookup_across_a_sliding_window_on_ring_caches(mistral: Pair) -> None:
    prompt = copy_heavy_prompt(mistral.ours)
    ring = dict(prefill_chunk_size=8, cache_bucket_size=128, max_new_tokens=30, **GREEDY)  # rings of 12 slots
    ours = mistral.ours.generate(prompt, prompt_lookup_num_tokens=5, **ring)
    assert torch.equal(ours, mistral.upstream.generate(prompt, max_new_tokens=30, **GREEDY))
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens .8. \\+ 1 must be <= prefill_chunk_size"):
        mistral.ours.generate(prompt, prompt_lookup_num_tokens=8, **ring)


def test_prompt_lookup_compiles_prefill_and_verify_once(llama: Pair) -> None:
    prompt = copy_heavy_prompt(llama.ours)
    calls = [
        dict(input_ids=prompt, max_new_tokens=20, prompt_lookup_num_tokens=5, **GREEDY),
        dict(input_ids=prompt[:, 4:], max_new_tokens=12, prompt_lookup_num_tokens=5, **GREEDY),
    ]
    counts, outputs = count_graphs(llama.ours, calls, then_no_recompile=True, backend="eager")
    assert counts[0] <= 2 and counts[1] == counts[0], counts
    assert torch.equal(outputs[0], llama.ours.generate(prompt, max_new_tokens=20, **GREEDY))


def test_lookup_takes_the_longest_ngram_first_and_its_leftmost_match() -> None:
    tokens = [1, 2, 3, 9, 2, 3, 4, 5, 7, 2, 3]
    assert lookup_candidates(tokens, 3, 2) == [9, 2, 3]  # "2 3" first at index 1
    assert lookup_candidates([4, 1, 8, 1, 5, 6, 1], 2, 3) == [8, 1]  # no 2-gram match: 1-gram "1"
    assert lookup_candidates([1, 2, 3], 4, 2) == []
    assert lookup_candidates([7, 8, 7], 4, 2) == [8, 7]  # a continuation stops at the text's end


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(cache_implementation="dynamic"), NotImplementedError, "cache_implementation='dynamic'"),
        (dict(repetition_penalty=1.3), NotImplementedError, "logits processors"),
        (dict(num_beams=2), NotImplementedError, "num_beams > 1"),
        (dict(stop_strings="x"), NotImplementedError, "stop_strings with prompt_lookup_num_tokens"),
        (dict(prompt_lookup_num_tokens=0), ValueError, "must be >= 1"),
        (dict(max_matching_ngram_size=0), ValueError, "must be >= 1"),
    ],
)
def test_prompt_lookup_refusals_name_the_field(llama: Pair, kwargs: dict, error: type, match: str) -> None:
    kwargs = {"prompt_lookup_num_tokens": 3, **kwargs}
    with pytest.raises(error, match=match):
        llama.ours.generate(torch.tensor([[4, 5, 4]]), max_new_tokens=2, **kwargs)


def test_prompt_lookup_batches_refuse_per_step_outputs(llama: Pair) -> None:
    """Batches run (upstream refuses them; see test_assisted_decoding), but rows keep different numbers of tokens
    per step: a streamer or per-step scores cannot line up."""
    with pytest.raises(NotImplementedError, match="streamer with prompt_lookup_num_tokens at batch size > 1"):
        llama.ours.generate(
            torch.tensor([[4, 5], [6, 7]]), max_new_tokens=2, prompt_lookup_num_tokens=3, streamer=object()
        )


def test_prompt_lookup_sampling_and_scores_follow_the_model(llama: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampling with top_k=1 is greedy: drafts are kept while they equal the model's samples, and each kept
    token's scores are the model's at its position."""
    prompt = copy_heavy_prompt(llama.ours)
    outputs = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, max_new_tokens=30)
    expected = llama.ours.generate(prompt, **outputs, **GREEDY)
    stats = candidate_stats(monkeypatch)
    sampled = llama.ours.generate(prompt, prompt_lookup_num_tokens=5, do_sample=True, top_k=1, **outputs, **GREEDY)
    assert torch.equal(sampled.sequences, expected.sequences)
    assert stats["accepted"] > 0
    torch.testing.assert_close(torch.cat(sampled.logits), torch.cat(expected.logits), atol=1e-5, rtol=1e-5)
    assert all(bool(torch.isfinite(s).sum() == 1) for s in sampled.scores)  # top_k=1: one token left per step
