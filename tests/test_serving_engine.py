"""The serving engine without HTTP: token identity with `generate`, graph counts, fairness, sampling, stops."""

from __future__ import annotations

import queue
import time

import pytest
import torch

import transformers_static as ts
from transformers_static.bench.measure import graphs_compiled
from transformers_static.serving import Engine, EngineError, Event, Request, SamplingParams
from transformers_static.serving.sampling import TextStream, sample_rows

from .tokenizer_fixtures import tiny_llama_checkpoint

WAIT_S = 120  # every wait on the engine is bounded


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_llama_checkpoint(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="module")
def model(checkpoint: str) -> ts.LlamaForCausalLM:
    return ts.AutoModelForCausalLM.from_pretrained(checkpoint).eval()


@pytest.fixture(scope="module")
def tokenizer(checkpoint: str):
    return ts.AutoTokenizer.from_pretrained(checkpoint)


def submit(engine: Engine, prompt: list[int], params: SamplingParams) -> queue.Queue:
    events: queue.Queue = queue.Queue()
    engine.submit(Request(prompt, params, events.put))
    return events


def collect(events: queue.Queue) -> tuple[list[int], str, Event]:
    ids, text = [], ""
    while True:
        event = events.get(timeout=WAIT_S)
        ids += event.token_ids
        text += event.text
        if event.finish_reason is not None:
            return ids, text, event


def generate_alone(model, prompt: list[int], max_tokens: int) -> list[int]:
    """`generate`'s greedy tokens, up to and including the first EOS."""
    new = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False)[0, len(prompt) :]
    new = new.tolist()
    eos = model.generation_config.eos_token_id
    return new[: new.index(eos) + 1] if eos in new else new


def test_concurrent_greedy_requests_match_generate_and_compile_two_graphs(model) -> None:
    """(a) 16 concurrent greedy requests of mixed prompt and output lengths on 4 slots each give `generate`'s
    tokens; (b) the whole run compiles the prefill-chunk graph and the decode graph, nothing else."""
    torch._dynamo.reset()
    before = graphs_compiled()
    forward = torch.compile(model.forward, backend="eager", fullgraph=True, dynamic=False)
    engine = Engine(model, max_batch=4, max_len=80, prefill_chunk=8, forward=forward).start()
    generator = torch.Generator().manual_seed(0)
    requests = []
    try:
        for _ in range(16):
            n = int(torch.randint(1, 30, (1,), generator=generator))
            prompt = torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist()
            max_tokens = int(torch.randint(1, 20, (1,), generator=generator))
            requests.append((prompt, max_tokens, submit(engine, prompt, SamplingParams(max_tokens, 0.0))))
        served = [collect(events) for _, _, events in requests]
    finally:
        engine.stop()
    assert graphs_compiled() - before == 2
    for (prompt, max_tokens, _), (ids, _, last) in zip(requests, served, strict=True):
        assert ids == generate_alone(model, prompt, max_tokens), prompt
        assert last.finish_reason == ("length" if len(ids) == max_tokens and ids[-1] not in engine.eos else "stop")
        assert last.prompt_tokens == len(prompt) and last.completion_tokens == len(ids)


def test_requests_are_served_first_come_first_served(model) -> None:
    """(e) at the engine: 24 requests on 2 slots get their first tokens in arrival order, and all complete."""
    engine = Engine(model, max_batch=2, max_len=32, prefill_chunk=4)
    streams = [submit(engine, [5 + i % 7] * (1 + i % 9), SamplingParams(3, 0.0)) for i in range(24)]
    first_token_order = []
    engine.start()
    try:
        pending = dict(enumerate(streams))
        deadline = time.monotonic() + WAIT_S
        while pending and time.monotonic() < deadline:
            for index, events in list(pending.items()):
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    continue
                if index not in first_token_order:
                    first_token_order.append(index)
                if event.finish_reason is not None:
                    del pending[index]
            time.sleep(0.001)
    finally:
        engine.stop()
    assert not pending and first_token_order == list(range(24))


def test_a_cancelled_request_frees_its_slot_before_the_next_step(model) -> None:
    """(d) at the engine: once cancelled, a request holds its slot for no further step; the queue moves on."""
    engine = Engine(model, max_batch=1, max_len=200, prefill_chunk=4).start()
    try:
        events = submit(engine, [5, 6, 7], SamplingParams(150, 0.0))
        waiting = submit(engine, [8, 9], SamplingParams(2, 0.0))
        first = events.get(timeout=WAIT_S)
        request = next(r for r in [engine.slots[0]] if r is not None).request
        request.cancel()
        ids, _, last = collect(events)
        assert last.finish_reason == "cancelled" and len(first.token_ids) + len(ids) < 150
        assert collect(waiting)[2].finish_reason == "length"
    finally:
        engine.stop()


def test_a_failing_forward_ends_its_requests_with_an_error_and_the_engine_goes_on(model) -> None:
    calls = []

    def forward(**inputs):
        calls.append(inputs["input_ids"].shape)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return model(**inputs)

    engine = Engine(model, max_batch=2, max_len=32, prefill_chunk=4, forward=forward).start()
    try:
        assert collect(submit(engine, [5, 6], SamplingParams(3, 0.0)))[2].finish_reason == "error"
        ids, _, last = collect(submit(engine, [5, 6], SamplingParams(3, 0.0)))
        assert last.finish_reason in ("length", "stop") and ids == generate_alone(model, [5, 6], 3)
    finally:
        engine.stop()


def test_bad_requests_are_refused_before_they_queue(model) -> None:
    engine = Engine(model, max_batch=1, max_len=16, prefill_chunk=4)
    with pytest.raises(EngineError, match="prompt is empty"):
        engine.check([], 1)
    with pytest.raises(EngineError, match="outside the vocabulary") as err:
        engine.check([model.config.vocab_size], 1)
    assert err.value.status == 400
    with pytest.raises(EngineError, match="context \\(--max-len\\) is 16") as err:
        engine.check([1] * 16, 1)
    assert err.value.status == 413
    with pytest.raises(EngineError, match="max_tokens must be between 1 and 6"):
        engine.check([1] * 10, 7)
    with pytest.raises(ValueError, match="max_batch >= 1"):
        Engine(model, max_batch=0)


def test_sliding_window_models_get_full_length_slots() -> None:
    """A sliding-window model serves with full-length slots (no rings): the window is in the mask."""
    config = ts.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=3,
    )  # fmt: skip
    engine = Engine(ts.MistralForCausalLM(config).eval(), max_batch=2, max_len=20, prefill_chunk=4)
    assert engine.cache.ring_windows == {} and engine.cache.key_cache[0].shape[2] == 24


def test_seeded_sampling_is_reproducible_whatever_shares_the_batch(model) -> None:
    params = SamplingParams(12, temperature=1.0, top_p=0.9, seed=1234)
    outputs = []
    for companions in (0, 3):
        engine = Engine(model, max_batch=4, max_len=40, prefill_chunk=4).start()
        try:
            others = [submit(engine, [7, 8, 9 + i], SamplingParams(12, 1.0, seed=i)) for i in range(companions)]
            outputs.append(collect(submit(engine, [3, 4, 5], params))[0])
            [collect(events) for events in others]
        finally:
            engine.stop()
    assert outputs[0] == outputs[1] and len(outputs[0]) > 0


def test_sample_rows_mixes_greedy_temperature_and_top_p() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [2.0, 2.1, 0.0]])
    noise = torch.empty(3, 3).exponential_(generator=torch.Generator().manual_seed(0))
    picked = sample_rows(
        logits,
        greedy=torch.tensor([True, False, False]),
        temperature=torch.tensor([1.0, 1.0, 1.0]),
        top_p=torch.tensor([1.0, 0.01, 1.0]),
        noise=noise,
    )
    assert picked[:2].tolist() == [1, 1]  # greedy; top_p keeps only the best token
    draws = [
        sample_rows(
            logits[2:],
            greedy=torch.tensor([False]),
            temperature=torch.tensor([1.0]),
            top_p=torch.tensor([1.0]),
            noise=torch.empty(1, 3).exponential_(generator=torch.Generator().manual_seed(seed)),
        ).item()
        for seed in range(200)
    ]
    assert min(draws.count(0), draws.count(1)) > 50 and draws.count(2) < 40  # p = 0.45, 0.50, 0.06


class CharTokenizer:
    """Token i is chr(i); 0xFF is half of a character until the next token."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_stream_holds_back_stop_prefixes_and_cut_characters() -> None:
    stream = TextStream(CharTokenizer(), ["END"])
    sent = [stream.add(t) for t in b"abE"]
    assert sent == [("a", False), ("b", False), ("", False)]  # "E" may start "END"
    assert stream.add(ord("x")) == ("Ex", False)
    assert [stream.add(t) for t in b"EN"] == [("", False), ("", False)]
    assert stream.add(ord("D")) == ("", True)  # the stop string itself is not sent
    cut = TextStream(CharTokenizer(), [])
    assert cut.add(0xC3) == ("", False) and cut.add(0xA9) == ("é", False)
