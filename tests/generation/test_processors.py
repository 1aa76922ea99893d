"""Logits processors on the static path against upstream's generate: greedy tokens equal on a left-padded batch of
three, each processor changing the tokens; sampling warpers against upstream's warper objects on the same logits;
the processing step and the decode graph each compile once with every processor on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
import transformers
from torch._dynamo.testing import CompileCounter
from transformers.generation import logits_process as upstream_lp

from transformers_static import GenerationConfig
from transformers_static.generation.configuration_utils import GenerationLengths
from transformers_static.generation.logits_process import filter_logits, logits_processing, remove_invalid

from ..models.causal_lm_tester import count_graphs, generation_prompt
from .conftest import VOCAB, Pair

NEW = 10
BASE = dict(max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
# Upstream counts padding as prompt text in these (the pad id joins the prompt's n-grams and token set); here padding
# is never text, so their reference is upstream run on each row unpadded.
PADDING_AS_TEXT_UPSTREAM = {"encoder_repetition_penalty", "encoder_no_repeat_ngram_size", "no_repeat_ngram_size"}


@pytest.fixture(scope="module")
def prompt(llama: Pair) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of three ending in the model's own greedy text, so repetition-aware processors bite."""
    ids, mask = generation_prompt(VOCAB)
    text = llama.ours.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None)
    return text, F.pad(mask, (0, 12), value=1)


@pytest.fixture(scope="module")
def greedy(llama: Pair, prompt: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Plain greedy new tokens `[3, NEW]` for the prompt."""
    ids, mask = prompt
    return llama.ours.generate(ids, attention_mask=mask, **BASE)[:, ids.shape[1] :]


def most_common(tokens: torch.Tensor) -> int:
    return int(tokens.flatten().mode().values)


def first_step(tokens: torch.Tensor, row: int) -> int:
    """The first step at which `row` makes the token it makes at step 1."""
    return int((tokens[row] == tokens[row, 1]).nonzero()[0])


# name -> (plain greedy new tokens -> (the processor's fields, fields it needs that the baseline keeps too))
CASES: dict[str, Callable[[torch.Tensor], tuple[dict[str, Any], dict[str, Any]]]] = {
    "repetition_penalty": lambda g: (dict(repetition_penalty=1.8), {}),
    "encoder_repetition_penalty": lambda g: (dict(encoder_repetition_penalty=2.0), {}),
    "no_repeat_ngram_size": lambda g: (dict(no_repeat_ngram_size=2), {}),
    "encoder_no_repeat_ngram_size": lambda g: (dict(encoder_no_repeat_ngram_size=2), {}),
    # EOS suppressed exactly through the step where row 0 first made it
    "min_new_tokens": lambda g: (dict(min_new_tokens=first_step(g, 0) + 1), dict(eos_token_id=int(g[0, 1]))),
    "min_length": lambda g: (dict(min_length=22 + first_step(g, 0) + 1), dict(eos_token_id=int(g[0, 1]))),
    "suppress_tokens": lambda g: (dict(suppress_tokens=[most_common(g)]), {}),
    "begin_suppress_tokens": lambda g: (dict(begin_suppress_tokens=g[:, 0].tolist()), {}),
    "bad_words_ids_single": lambda g: (dict(bad_words_ids=[[most_common(g)]]), {}),
    "bad_words_ids_multi": lambda g: (dict(bad_words_ids=[g[1, 2:4].tolist(), g[2, 4:7].tolist()]), {}),
    "sequence_bias": lambda g: (dict(sequence_bias=[[g[2, 3:5].tolist(), -9.0], [[int(g[0, 5])], -4.0]]), {}),
    # a token other than the one row 2 makes after two of its tokens, raised there only
    "sequence_bias_after_two": lambda g: (dict(sequence_bias=[[[*g[2, 4:6].tolist(), int(g[1, 0])], 9.0]]), {}),
    "forced_eos_token_id": lambda g: (dict(forced_eos_token_id=[5, 6]), {}),
    "exponential_decay_length_penalty": lambda g: (
        dict(exponential_decay_length_penalty=(2, 3.0)),
        dict(eos_token_id=int(g[0, 5])),
    ),
}


def upstream_reference(pair: Pair, name: str, ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Upstream's tokens for the batch; for processors where upstream treats padding as text, each row alone."""
    if name not in PADDING_AS_TEXT_UPSTREAM:
        return pair.upstream.generate(ids, attention_mask=mask, **kwargs)
    rows = []
    for row, real in zip(ids, mask.bool(), strict=True):
        alone = row[real][None]  # the mask is explicit: upstream would mask every pad id it holds
        rows.append(
            pair.upstream.generate(alone, attention_mask=torch.ones_like(alone), **kwargs)[0, alone.shape[1] :]
        )
    new = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=kwargs["pad_token_id"])
    return torch.cat([ids, new], dim=1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_processor_matches_upstream_and_changes_the_tokens(
    llama: Pair, prompt: tuple[torch.Tensor, torch.Tensor], greedy: torch.Tensor, name: str
) -> None:
    ids, mask = prompt
    fields, context = CASES[name](greedy)
    kwargs = {**BASE, **context, **fields}
    ours = llama.ours.generate(ids, attention_mask=mask, **kwargs)
    torch.testing.assert_close(ours, upstream_reference(llama, name, ids, mask, **kwargs), rtol=0, atol=0)
    baseline = llama.ours.generate(ids, attention_mask=mask, **{**BASE, **context})
    assert not torch.equal(ours, baseline), f"{name} changed nothing: a useless test"


def test_forced_bos_and_begin_suppress_on_a_one_token_prompt(llama: Pair) -> None:
    """Upstream forces BOS only when the prompt is one token long, and then suppresses the begin tokens one step
    later."""
    ids = torch.tensor([[5], [9], [17]])
    plain = llama.ours.generate(ids, **BASE)
    forced = llama.ours.generate(ids, **BASE, forced_bos_token_id=7)
    torch.testing.assert_close(forced, llama.upstream.generate(ids, **BASE, forced_bos_token_id=7), rtol=0, atol=0)
    assert (forced[:, 1] == 7).all() and not torch.equal(forced, plain)
    kwargs = dict(BASE, forced_bos_token_id=7, begin_suppress_tokens=forced[:, 2].tolist())
    ours = llama.ours.generate(ids, **kwargs)
    torch.testing.assert_close(ours, llama.upstream.generate(ids, **kwargs), rtol=0, atol=0)
    assert (ours[:, 1] == 7).all() and not (ours[:, 2:3] == forced[:, 2]).any()


def test_all_processors_together_match_upstream_and_keep_one_decode_graph(
    llama: Pair, prompt: tuple[torch.Tensor, torch.Tensor], greedy: torch.Tensor
) -> None:
    ids, mask = prompt
    kwargs = dict(BASE, eos_token_id=int(greedy[0, 1]), min_new_tokens=3, renormalize_logits=True)
    for name in sorted(set(CASES) - PADDING_AS_TEXT_UPSTREAM - {"min_length", "bad_words_ids_single"}):
        kwargs.update(CASES[name](greedy)[0])
    expected = llama.upstream.generate(ids, attention_mask=mask, **kwargs)
    with_padding_rules = dict(kwargs, repetition_penalty=1.3, no_repeat_ngram_size=3, encoder_no_repeat_ngram_size=4)
    calls = [
        dict(input_ids=ids, attention_mask=mask, **kwargs),
        dict(input_ids=ids[:, 3:], attention_mask=mask[:, 3:], **dict(with_padding_rules, max_new_tokens=7)),
    ]
    counts, outputs = count_graphs(llama.ours, calls, then_no_recompile=True)
    assert counts == [2, 2], "one prefill and one decode graph, whatever the processors; none on the second call"
    torch.testing.assert_close(outputs[0], expected, rtol=0, atol=0)


def test_processing_step_compiles_to_one_graph_for_every_step() -> None:
    """Every processor and warper on: the step is one fullgraph compile, reused at every step (no recompile), and
    gives the eager scores."""
    config = GenerationConfig(
        do_sample=True,
        **{"repetition_penalty": 1.3, "encoder_repetition_penalty": 1.2, "no_repeat_ngram_size": 2},
        **{"encoder_no_repeat_ngram_size": 3, "bad_words_ids": [[5], [6, 7]], "sequence_bias": [[[8, 9], -2.0]]},
        **{"min_new_tokens": 3, "eos_token_id": 2, "forced_eos_token_id": 2, "remove_invalid_values": True},
        **{"exponential_decay_length_penalty": (2, 1.5), "suppress_tokens": [10], "begin_suppress_tokens": [11]},
        **{"temperature": 0.8, "top_h": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "typical_p": 0.95},
        **{"epsilon_cutoff": 1e-4, "eta_cutoff": 1e-3, "renormalize_logits": True},
    ).with_defaults()
    ids, mask = generation_prompt(VOCAB)
    ids, mask = F.pad(ids, (22, 0)), F.pad(mask, (22, 0))  # as the static path holds it: one 32-token chunk
    lengths = GenerationLengths(max_new_tokens=8, min_new_tokens=3, max_length=18)
    eager, compiled = (
        logits_processing(config, lengths, ids, mask, prompt_width=10, capacity=64, vocab_size=VOCAB) for _ in "ab"
    )
    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(compiled.__call__, backend=counter, fullgraph=True, dynamic=False)
    generator = torch.Generator().manual_seed(0)
    try:
        for i in range(lengths.max_new_tokens):
            logits = torch.randn(3, VOCAB, generator=generator) * 3
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                scores = step(logits)
            torch.testing.assert_close(scores, eager(logits), rtol=0, atol=1e-6)
            token = torch.randint(0, VOCAB, (3,), generator=generator)
            eager.append(token)
            compiled.append(token)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 1


def test_output_scores_are_upstreams_processed_scores(
    llama: Pair, prompt: tuple[torch.Tensor, torch.Tensor], greedy: torch.Tensor
) -> None:
    ids, mask = prompt
    kwargs = dict(BASE, repetition_penalty=1.5, suppress_tokens=[int(greedy[0, 0])], renormalize_logits=True)
    kwargs.update(return_dict_in_generate=True, output_scores=True, output_logits=True)
    ours = llama.ours.generate(ids, attention_mask=mask, **kwargs)
    theirs = llama.upstream.generate(ids, attention_mask=mask, **kwargs)
    torch.testing.assert_close(ours.sequences, theirs.sequences, rtol=0, atol=0)
    torch.testing.assert_close(torch.stack(ours.logits), torch.stack(theirs.logits), rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.stack(ours.scores), torch.stack(theirs.scores), rtol=0, atol=1e-4)
    assert not torch.allclose(torch.stack(ours.scores), torch.stack(ours.logits))  # processed, not raw


def test_logits_and_scores_of_finished_rows_are_upstreams(
    llama: Pair, prompt: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """A row that hits EOS early is fed the pad id from then on, as upstream feeds it, so its later logits and
    processed scores (the repetition penalty sees the pads) are upstream's too."""
    ids, mask = prompt
    kwargs = dict(BASE, repetition_penalty=1.3, pad_token_id=1)
    running = llama.ours.generate(ids, attention_mask=mask, **kwargs)[:, ids.shape[1] :]
    eos = int(running[0, 2])  # row 0 finishes at its third new token
    assert eos not in running[1].tolist() and eos != 1  # row 1 runs on after row 0 finished
    kwargs.update(eos_token_id=eos, return_dict_in_generate=True, output_scores=True, output_logits=True)
    ours = llama.ours.generate(ids, attention_mask=mask, **kwargs)
    theirs = llama.upstream.generate(ids, attention_mask=mask, **kwargs)
    torch.testing.assert_close(ours.sequences, theirs.sequences, rtol=0, atol=0)
    assert ours.sequences[0, -NEW + 3 :].tolist() == [1] * (NEW - 3)  # row 0 padded after its EOS
    assert len(ours.logits) == NEW  # the steps after row 0 finished are compared
    torch.testing.assert_close(torch.stack(ours.logits), torch.stack(theirs.logits), rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.stack(ours.scores), torch.stack(theirs.scores), rtol=0, atol=1e-4)


def test_max_time_stops_like_upstream(llama: Pair) -> None:
    ids = torch.tensor([[5, 6, 7]])
    ours = llama.ours.generate(ids, **dict(BASE, max_time=0.0))
    assert ours.shape == llama.upstream.generate(ids, **dict(BASE, max_time=0.0)).shape == (1, 4)


# ---------------------------------------------------------------------- warpers on the same logits
UPSTREAM_WARPERS = {
    "temperature": lambda v: upstream_lp.TemperatureLogitsWarper(v),
    "top_k": lambda v: upstream_lp.TopKLogitsWarper(v),
    "top_p": lambda v: upstream_lp.TopPLogitsWarper(v),
    "top_h": lambda v: upstream_lp.TopHLogitsWarper(v),
    "min_p": lambda v: upstream_lp.MinPLogitsWarper(v),
    "typical_p": lambda v: upstream_lp.TypicalLogitsWarper(v),
    "epsilon_cutoff": lambda v: upstream_lp.EpsilonLogitsWarper(v),
    "eta_cutoff": lambda v: upstream_lp.EtaLogitsWarper(v),
}
# the sampling fields at their no-op values, so that one warper at a time runs
NO_WARPING = dict(
    do_sample=True, temperature=1.0, top_k=0, top_p=1.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0
)


def sample_logits() -> torch.Tensor:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    logits[1, :7] = -float("inf")  # a row already filtered by an earlier processor
    return logits


def assert_same_distribution(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    torch.testing.assert_close(ours.softmax(-1), theirs.softmax(-1), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", 0.6),
        ("top_k", 7),
        ("top_p", 0.7),
        ("top_h", 0.4),
        ("min_p", 0.1),
        ("typical_p", 0.6),
        ("epsilon_cutoff", 0.02),
        ("eta_cutoff", 0.05),
    ],
)
def test_warper_matches_upstream_warper(name: str, value: float) -> None:
    logits = sample_logits()
    ours = filter_logits(logits.clone(), GenerationConfig(**{**NO_WARPING, name: value}))
    theirs = UPSTREAM_WARPERS[name](value)(None, logits.clone())
    assert not torch.equal(ours, logits), f"{name}={value} changed nothing: a useless test"
    assert_same_distribution(ours, theirs)


def test_warpers_chain_in_upstreams_order(llama: Pair) -> None:
    """All warpers at once, against the list upstream's generate builds from the same config."""
    values = dict(temperature=0.7, top_h=0.9, top_k=30, top_p=0.95, min_p=0.02, typical_p=0.97)
    values.update(epsilon_cutoff=0.001, eta_cutoff=0.002)
    config = transformers.GenerationConfig(do_sample=True, **values)
    theirs = llama.upstream._get_logits_processor(generation_config=config, input_ids_seq_length=4, device="cpu")
    logits = sample_logits() / 3  # flatter: some 20 tokens survive the chain, so the order matters
    assert_same_distribution(
        filter_logits(logits.clone(), GenerationConfig(do_sample=True, **values)), theirs(None, logits)
    )


def test_remove_invalid_values_matches_upstream() -> None:
    logits = sample_logits()
    logits[0, 3], logits[2, 5], logits[3, 1] = float("nan"), float("inf"), -float("inf")
    expected = upstream_lp.InfNanRemoveLogitsProcessor()(None, logits.clone())
    torch.testing.assert_close(remove_invalid(logits), expected, rtol=0, atol=0)
