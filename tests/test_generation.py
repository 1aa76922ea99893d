"""generate(): static vs dynamic, sampling, streaming, bad input, and compile behaviour counted by dynamo."""

import pytest
import torch
import torch._dynamo
import transformers
from torch._dynamo.utils import counters
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from transformers_static import AutoModelForCausalLM, GenerationConfig, StaticCache
from transformers_static.generation.logits_process import filter_logits

from .models.causal_lm_tester import count_graphs, generation_prompt

VOCAB = 64


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    torch.manual_seed(0)
    configs = {
        "llama": transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            eos_token_id=2,
        ),
        "mistral": transformers.MistralConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            sliding_window=5,
            eos_token_id=2,
        ),
        "gpt2": transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=40, eos_token_id=2
        ),
    }
    paths = {}
    for name, config in configs.items():
        paths[name] = str(tmp_path_factory.mktemp(name))
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(paths[name])
    return paths


@pytest.fixture
def llama(checkpoints: dict[str, str]):
    return AutoModelForCausalLM.from_pretrained(checkpoints["llama"])


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
def test_static_and_dynamic_give_the_same_per_step_logits(checkpoints: dict[str, str], arch: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(checkpoints[arch])
    ids, mask = generation_prompt(VOCAB)
    runs = {
        impl: model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=15,
            eos_token_id=None,
            cache_implementation=impl,
            return_dict_in_generate=True,
            output_logits=True,
        )
        for impl in ("static", "dynamic")
    }
    assert torch.equal(runs["static"].sequences, runs["dynamic"].sequences)
    assert len(runs["static"].logits) == 15
    torch.testing.assert_close(
        torch.stack(runs["static"].logits), torch.stack(runs["dynamic"].logits), atol=1e-4, rtol=0
    )


def test_sampling_is_reproducible_under_a_seed(llama) -> None:
    ids, mask = generation_prompt(VOCAB)
    kwargs = dict(attention_mask=mask, max_new_tokens=10, do_sample=True, temperature=1.5, top_k=20, top_p=0.9)
    first = llama.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    second = llama.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    other = llama.generate(ids, generator=torch.Generator().manual_seed(8), **kwargs)
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_top_k_1_sampling_equals_greedy(llama) -> None:
    ids, mask = generation_prompt(VOCAB)
    greedy = llama.generate(ids, attention_mask=mask, max_new_tokens=10)
    sampled = llama.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=1, temperature=3.0)
    assert torch.equal(greedy, sampled)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 5, 1.0), (1.0, None, 0.8), (1.3, 10, 0.5)])
def test_logit_filters_match_upstream_warpers(temperature: float, top_k: int | None, top_p: float) -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(torch.isinf(filter_logits(logits, config)), torch.isinf(expected))
    torch.testing.assert_close(filter_logits(logits, config), expected)


def test_streamer_gets_prompt_then_each_token_then_end(llama) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.calls: list = []

        def put(self, value: torch.Tensor) -> None:
            self.calls.append(value.clone())

        def end(self) -> None:
            self.calls.append("end")

    ids = torch.tensor([[5, 6, 7, 8]])
    streamer = Recorder()
    out = llama.generate(ids, max_new_tokens=6, eos_token_id=None, streamer=streamer)
    assert torch.equal(streamer.calls[0], ids) and streamer.calls[-1] == "end"
    assert torch.equal(torch.cat(streamer.calls[1:-1]), out[0, 4:])


def test_generation_config_is_read_from_the_checkpoint(checkpoints: dict[str, str], tmp_path) -> None:
    GenerationConfig(max_new_tokens=3, eos_token_id=None).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(checkpoints["llama"])
    upstream_written = model.generation_config  # upstream's save_pretrained wrote one
    assert upstream_written.eos_token_id == 2
    model.generation_config = GenerationConfig.from_pretrained(tmp_path)
    assert model.generate(torch.tensor([[4, 5]])).shape == (1, 5)


def test_unknown_generation_argument_is_an_error(llama) -> None:
    with pytest.raises(ValueError, match=r"Unknown generation argument\(s\) \['max_new_token'\]"):
        llama.generate(torch.tensor([[4, 5]]), max_new_token=3)


def test_bad_input_gives_clear_errors(checkpoints: dict[str, str], llama) -> None:
    ids = torch.tensor([[4, 5, 6], [7, 8, 9]])
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \[2, 3\]"):
        llama.generate(ids, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size 2 is larger than the given StaticCache's max_batch_size 1"):
        llama.generate(ids, past_key_values=StaticCache(llama.config, 1, 64))
    with pytest.raises(ValueError, match="the given StaticCache holds 40 tokens but generation needs 42"):
        llama.generate(ids, max_new_tokens=10, past_key_values=StaticCache(llama.config, 2, 40))
    gpt2 = AutoModelForCausalLM.from_pretrained(checkpoints["gpt2"])
    with pytest.raises(ValueError, match="43 positions requested .* position table has 40"):
        gpt2.generate(ids, max_new_tokens=40)


def test_classic_growing_mask_compiles_a_graph_per_step(llama) -> None:
    """The problem this library solves, measured: the dynamic path's mask grows, so every step is a new graph."""
    ids, mask = generation_prompt(VOCAB)
    with torch._dynamo.config.patch(recompile_limit=64):
        counts, _ = count_graphs(
            llama,
            [
                dict(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=12,
                    eos_token_id=None,
                    cache_implementation="dynamic",
                )
            ],
        )
    assert counts == [12]


def test_inductor_compile_gives_eager_tokens(llama) -> None:
    """The one real inductor compile of the suite (slow on 2 cores): tokens equal eager's, one graph (the decode
    step, its decoder layers one shared region; compile=True runs the prefill eager), and a new prompt length
    compiles nothing."""
    ids, mask = generation_prompt(VOCAB)
    expected = llama.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None)
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = llama.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None, compile=True)
        assert counters["stats"]["unique_graphs"] == 1
        llama.generate(ids[:, 2:], attention_mask=mask[:, 2:], max_new_tokens=5, eos_token_id=None, compile=True)
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, expected)


def test_pad_id_outside_the_vocabulary_is_only_written_never_fed(llama) -> None:
    """Upstream lets pad_token_id lie outside the vocabulary; finished rows must not feed it to the model."""
    ids, mask = generation_prompt(VOCAB)
    free_run = llama.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None)
    eos = int(free_run[0, ids.shape[1]])  # row 0 finishes at its first token
    out = llama.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos, pad_token_id=VOCAB + 7)
    assert out[0, ids.shape[1]] == eos and (out[0, ids.shape[1] + 1 :] == VOCAB + 7).all()
