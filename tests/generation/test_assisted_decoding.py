"""Assisted decoding: a draft model (another architecture, or the model itself) proposes tokens that one fixed-width
verify step checks. Greedy output equals plain greedy (and upstream's assisted generation), batches too (rows at their
own cache positions); sampling keeps the model's exact distribution (speculative sampling, checked on the rule and end
to end); the model and the draft each compile once; refusals name the field."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import transformers
from torch._dynamo.testing import CompileCounterWithBackend

from transformers_static import AutoModelForCausalLM
from transformers_static.generation.candidate_generator import speculative_accept
from transformers_static.generation.logits_process import top_k

from .conftest import VOCAB, Pair, candidate_stats, save_noisy

GREEDY = dict(eos_token_id=None, pad_token_id=0)
PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])


@pytest.fixture(scope="module")
def qwen2_draft(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """A draft of another architecture with the same vocabulary (biases on q/k/v, one layer)."""
    torch.manual_seed(1)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=2,
    )
    upstream = transformers.Qwen2ForCausalLM(config)
    path = str(tmp_path_factory.mktemp("qwen2_draft"))
    save_noisy(upstream, path)
    return Pair(path, upstream, AutoModelForCausalLM.from_pretrained(path))


def test_assisted_greedy_equals_greedy_and_upstream(
    llama: Pair, qwen2_draft: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = llama.ours.generate(PROMPT, max_new_tokens=24, **GREEDY)
    stats = candidate_stats(monkeypatch)
    ours = llama.ours.generate(PROMPT, max_new_tokens=24, assistant_model=qwen2_draft.ours, **GREEDY)
    assert torch.equal(ours, expected)
    assert stats["drafted"] > stats["accepted"]  # a random draft is mostly rejected: the rewinds are exercised
    theirs = llama.upstream.generate(PROMPT, max_new_tokens=24, assistant_model=qwen2_draft.upstream, **GREEDY)
    assert torch.equal(ours, theirs)


def test_the_model_as_its_own_draft_is_always_accepted(llama: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    stats = candidate_stats(monkeypatch)
    fields = dict(num_assistant_tokens=5, assistant_confidence_threshold=0.0)
    ours = llama.ours.generate(PROMPT, max_new_tokens=24, assistant_model=llama.ours, **fields, **GREEDY)
    assert torch.equal(ours, llama.ours.generate(PROMPT, max_new_tokens=24, **GREEDY))
    # every draft kept: 23 tokens after the prefill's, 6 per verify step (5 drafts + the model's own), 5 in the last
    assert stats == {"verify_steps": 4, "drafted": 19, "accepted": 19}, stats


def test_assisted_stops_at_eos_and_keeps_scores_as_greedy(llama: Pair, qwen2_draft: Pair) -> None:
    greedy = llama.ours.generate(PROMPT, max_new_tokens=24, **GREEDY)
    eos = int(greedy[0, PROMPT.shape[1] + 11])
    kwargs = dict(max_new_tokens=24, eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True)
    kwargs |= dict(output_scores=True, output_logits=True)
    expected = llama.ours.generate(PROMPT, **kwargs)
    assert expected.sequences.shape[1] < greedy.shape[1]
    for draft in (llama.ours, qwen2_draft.ours):
        ours = llama.ours.generate(PROMPT, assistant_model=draft, num_assistant_tokens=4, **kwargs)
        assert torch.equal(ours.sequences, expected.sequences)
        assert len(ours.scores) == len(expected.scores) and len(ours.logits) == len(expected.logits)
        torch.testing.assert_close(torch.cat(ours.scores), torch.cat(expected.scores), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.cat(ours.logits), torch.cat(expected.logits), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "fields",
    [
        dict(num_assistant_tokens_schedule="heuristic"),
        dict(num_assistant_tokens_schedule="heuristic_transient", assistant_confidence_threshold=0.0),
        dict(assistant_confidence_threshold=0.9),
    ],
)
def test_schedules_and_confidence_change_the_drafts_not_the_output(
    llama: Pair, qwen2_draft: Pair, fields: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = candidate_stats(monkeypatch)
    base = dict(max_new_tokens=20, num_assistant_tokens=6, assistant_confidence_threshold=0.0, **GREEDY)
    llama.ours.generate(PROMPT, assistant_model=qwen2_draft.ours, **base)
    constant = dict(stats)
    ours = llama.ours.generate(PROMPT, assistant_model=qwen2_draft.ours, **(base | fields))
    assert torch.equal(ours, llama.ours.generate(PROMPT, max_new_tokens=20, **GREEDY))
    assert stats["drafted"] < constant["drafted"], (stats, constant)  # rejections shrink the drafts


def test_assistant_fields_come_from_the_call_then_the_assistant(
    llama: Pair, qwen2_draft: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = AutoModelForCausalLM.from_pretrained(qwen2_draft.path)
    draft.generation_config.num_assistant_tokens = 3
    draft.generation_config.assistant_confidence_threshold = 0.0
    stats = candidate_stats(monkeypatch)
    llama.ours.generate(PROMPT, max_new_tokens=9, assistant_model=draft, **GREEDY)
    # all rejected (a random draft): one token per step; 3 drafts per step, fewer at the end (none for the last)
    assert stats == {"verify_steps": 8, "drafted": 3 + 3 + 3 + 3 + 3 + 2 + 1 + 0, "accepted": 0}, stats
    llama.ours.generate(PROMPT, max_new_tokens=9, assistant_model=draft, num_assistant_tokens=1, **GREEDY)
    assert stats == {"verify_steps": 8, "drafted": 7, "accepted": 0}, stats


def test_assisted_across_a_sliding_window_on_ring_caches(mistral: Pair, qwen2_draft: Pair) -> None:
    ring = dict(prefill_chunk_size=8, cache_bucket_size=128, max_new_tokens=30, **GREEDY)  # rings of 12 slots
    expected = mistral.upstream.generate(PROMPT, max_new_tokens=30, **GREEDY)
    for draft in (mistral.ours, qwen2_draft.ours):
        ours = mistral.ours.generate(PROMPT, assistant_model=draft, num_assistant_tokens=7, **ring)
        assert torch.equal(ours, expected)
    with pytest.raises(ValueError, match="num_assistant_tokens .8. \\+ 1 must be <= prefill_chunk_size"):
        mistral.ours.generate(PROMPT, assistant_model=qwen2_draft.ours, num_assistant_tokens=8, **ring)


def count_both(model: Any, draft: Any, calls: list[dict]) -> list[tuple[int, int]]:
    """(model graphs, draft graphs) compiled after each call, with the user's own torch.compile of each forward;
    any recompile after the first call raises."""
    torch._dynamo.reset()
    counters = CompileCounterWithBackend("eager"), CompileCounterWithBackend("eager")
    forwards = model.forward, draft.forward
    for module, counter, forward in zip((model, draft), counters, forwards, strict=True):
        module.forward = torch.compile(forward, backend=counter, fullgraph=True, dynamic=False)
    counts = []
    try:
        for i, call in enumerate(calls):
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                model.generate(assistant_model=draft, **call)
            counts.append((counters[0].frame_count, counters[1].frame_count))
    finally:
        model.forward, draft.forward = forwards
        torch._dynamo.reset()
    return counts


def test_model_and_draft_each_compile_once(llama: Pair, qwen2_draft: Pair) -> None:
    calls = [
        dict(input_ids=PROMPT, max_new_tokens=16, num_assistant_tokens=4, **GREEDY),
        dict(input_ids=PROMPT[:, 2:], max_new_tokens=11, num_assistant_tokens=4, **GREEDY),
    ]
    counts = count_both(llama.ours, qwen2_draft.ours, calls)
    # the model: its prefill chunk and the verify step; the draft: its prefill chunk and the draft step
    assert counts[0] == (2, 2) and counts[1] == counts[0], counts


def test_speculative_rule_keeps_the_model_distribution() -> None:
    """The first kept token of a verify step is distributed as p (the model's), whatever q (the draft's) is."""
    generator = torch.Generator().manual_seed(0)
    p_logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -3.0], [0.0, 1.0, 0.5, -1.0, 2.0, 0.0]])  # [k+1, vocab]
    q_logits = torch.tensor([[-1.0, 0.0, 2.5, 1.0, -2.0, 0.0]])  # [k, vocab]: far from p
    q = q_logits.softmax(-1)[0]
    draws, firsts, kept_draft = 20000, Counter(), 0
    for _ in range(draws):
        draft = int(torch.multinomial(q, 1, generator=generator))
        taken, bonus = speculative_accept([draft], q_logits, p_logits, generator)
        firsts[draft if taken else bonus] += 1
        kept_draft += taken
    observed = torch.tensor([firsts[i] / draws for i in range(6)])
    p = p_logits[0].softmax(-1)
    assert (observed - p).abs().sum() / 2 < 0.02, (observed, p)
    assert 0.1 < kept_draft / draws < 0.9  # both branches taken: the residual sample is exercised


def test_assisted_sampling_keeps_the_model_joint_distribution(llama: Pair, qwen2_draft: Pair) -> None:
    """Two new tokens under top_k=3: the first from the prefill, the second from a verify step of one draft;
    their joint frequencies over 1,600 rows match the model's exact joint distribution (9 cells)."""
    sampling = dict(do_sample=True, top_k=3, max_new_tokens=3, assistant_confidence_threshold=0.0, **GREEDY)
    generator = torch.Generator().manual_seed(0)
    rows, calls = 400, 4  # each row an independent draw: rows verified at once, each by its own rule
    draws = rows * calls
    pairs = Counter()
    for _ in range(calls):
        out = llama.ours.generate(
            PROMPT.expand(rows, -1), assistant_model=qwen2_draft.ours, generator=generator, **sampling
        )
        pairs.update(tuple(row) for row in out[:, PROMPT.shape[1] : PROMPT.shape[1] + 2].tolist())
    with torch.no_grad():
        first = top_k(llama.ours(PROMPT).logits[0, -1:], 3).softmax(-1)[0]  # [vocab]
        exact = {}
        for t1 in first.nonzero().flatten().tolist():
            second = top_k(llama.ours(torch.cat([PROMPT, torch.tensor([[t1]])], 1)).logits[0, -1:], 3).softmax(-1)
            for t2 in second[0].nonzero().flatten().tolist():
                exact[(t1, t2)] = float(first[t1] * second[0, t2])
    assert set(pairs) <= set(exact), set(pairs) - set(exact)
    distance = sum(abs(pairs[cell] / draws - prob) for cell, prob in exact.items()) / 2
    assert distance < 0.06, (distance, pairs, exact)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_assistant_tokens=0), ValueError, "num_assistant_tokens must be an integer >= 1"),
        (dict(num_assistant_tokens_schedule="fast"), ValueError, "num_assistant_tokens_schedule must be one of"),
        (dict(assistant_confidence_threshold=1.5), ValueError, "assistant_confidence_threshold must be in"),
        (dict(prompt_lookup_num_tokens=3), ValueError, "choose one"),
        (dict(repetition_penalty=1.3), NotImplementedError, "logits processors .* with assistant_model"),
        (dict(num_beams=2), NotImplementedError, "num_beams > 1 with assistant_model"),
        (dict(stop_strings="x"), NotImplementedError, "stop_strings with assistant_model"),
        (dict(cache_implementation="dynamic"), NotImplementedError, "cache_implementation='dynamic'"),
        (dict(assistant_tokenizer=object()), NotImplementedError, "universal assisted decoding"),
        (dict(assistant_ensemble_weight=0.5), NotImplementedError, "assistant_ensemble_weight .ensemble"),
    ],
)
def test_assisted_refusals_name_the_field(
    llama: Pair, qwen2_draft: Pair, kwargs: dict, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        llama.ours.generate(PROMPT, max_new_tokens=3, assistant_model=qwen2_draft.ours, **kwargs)


def test_assistants_that_cannot_draft_are_refused(llama: Pair, tmp_path: Any) -> None:
    with pytest.raises(TypeError, match="assistant_model must be a transformers_static causal LM"):
        llama.ours.generate(PROMPT, max_new_tokens=3, assistant_model=llama.upstream)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB + 1, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    other_vocab = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="vocab_size .65. differs from the model's .64.: .* same tokenizer"):
        llama.ours.generate(PROMPT, max_new_tokens=3, assistant_model=other_vocab)


BATCH_PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [0, 0, 0, 9, 4, 7, 5, 6], [0, 0, 0, 0, 0, 0, 8, 3]])
BATCH_MASK = (BATCH_PROMPT != 0).long()


def test_assisted_batches_rows_at_their_own_lengths(
    llama: Pair, qwen2_draft: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three left-padded rows (upstream refuses batches here): each row keeps its own number of drafts per step and
    writes at its own cache slots; the tokens are plain batched greedy's, with rows that end early padded."""
    greedy = llama.ours.generate(BATCH_PROMPT, attention_mask=BATCH_MASK, max_new_tokens=20, **GREEDY)
    eos = int(greedy[1, BATCH_PROMPT.shape[1] + 6])  # row 1 ends early (others may too)
    kwargs = dict(attention_mask=BATCH_MASK, max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    expected = llama.ours.generate(BATCH_PROMPT, **kwargs)
    assert (expected[:, -1] == 0).any()  # a row finished early and was padded
    for draft, fields in ((qwen2_draft.ours, {}), (llama.ours, dict(assistant_confidence_threshold=0.0))):
        stats = candidate_stats(monkeypatch)
        ours = llama.ours.generate(BATCH_PROMPT, assistant_model=draft, num_assistant_tokens=4, **fields, **kwargs)
        assert torch.equal(ours, expected)
        assert stats["accepted"] > 0 or draft is qwen2_draft.ours
    lookup = llama.ours.generate(BATCH_PROMPT, prompt_lookup_num_tokens=3, **kwargs)
    assert torch.equal(lookup, expected)


def test_batched_verify_and_draft_steps_compile_once(llama: Pair, qwen2_draft: Pair) -> None:
    calls = [
        dict(input_ids=BATCH_PROMPT[:2], attention_mask=BATCH_MASK[:2], max_new_tokens=12, num_assistant_tokens=3),
        dict(input_ids=BATCH_PROMPT[1:], attention_mask=BATCH_MASK[1:], max_new_tokens=9, num_assistant_tokens=3),
    ]
    counts = count_both(llama.ours, qwen2_draft.ours, [call | GREEDY for call in calls])
    assert counts[0] == (2, 2) and counts[1] == counts[0], counts


def test_batched_candidates_refuse_what_cannot_line_up(llama: Pair, mistral: Pair, qwen2_draft: Pair) -> None:
    two = dict(
        input_ids=BATCH_PROMPT[:2], attention_mask=BATCH_MASK[:2], max_new_tokens=4, assistant_model=qwen2_draft.ours
    )
    with pytest.raises(NotImplementedError, match="output_scores with assistant_model at batch size > 1"):
        llama.ours.generate(**two, return_dict_in_generate=True, output_scores=True)
    ring = dict(prefill_chunk_size=8, cache_bucket_size=128, num_assistant_tokens=4)
    with pytest.raises(ValueError, match="batch size > 1 needs full-length cache slots"):
        mistral.ours.generate(**two, **ring)


def test_drafts_continue_the_kept_text_after_rewinds(llama: Pair, qwen2_draft: Pair, monkeypatch) -> None:
    """After every verify step (rejections rewind the draft's cursor; a fully kept step leaves a draft to store),
    each row's drafts are the draft model's own greedy continuation of that row's text so far."""
    from transformers_static.generation.assisted_decoding import DraftModel

    proposals = []
    original = DraftModel.propose

    def spy(self: DraftModel, texts: list[list[int]], limits: list[int]) -> Any:
        drafts, scores = original(self, texts, limits)
        proposals.append(([list(text) for text in texts], drafts))
        return drafts, scores

    monkeypatch.setattr(DraftModel, "propose", spy)
    fields = dict(num_assistant_tokens=3, assistant_confidence_threshold=0.0, max_new_tokens=16, **GREEDY)
    llama.ours.generate(BATCH_PROMPT, attention_mask=BATCH_MASK, assistant_model=qwen2_draft.ours, **fields)
    checked = 0
    for texts, drafts in proposals:
        for text, row_drafts in zip(texts, drafts, strict=True):
            if row_drafts:
                ids = torch.tensor([text])
                alone = qwen2_draft.ours.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(row_drafts), **GREEDY
                )
                assert alone[0, len(text) :].tolist() == row_drafts
                checked += 1
    assert checked > 10


def test_a_model_drafting_for_itself_keeps_its_draft_cache_apart(llama: Pair, monkeypatch) -> None:
    """The draft writes its own slots (idle rows write in place, rejected drafts stay behind): sharing the model's
    reused cache would overwrite the model's keys."""
    from transformers_static.generation.assisted_decoding import DraftModel

    caches = []
    original = DraftModel.__init__

    def spy(self: DraftModel, session: Any, *args: Any) -> None:
        caches.append(session.cache)
        original(self, session, *args)

    monkeypatch.setattr(DraftModel, "__init__", spy)
    llama.ours.generate(
        BATCH_PROMPT, attention_mask=BATCH_MASK, assistant_model=llama.ours, max_new_tokens=6, **GREEDY
    )
    assert caches and caches[0] is not llama.ours._generation_cache[1]
