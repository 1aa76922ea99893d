"""generate(): against upstream's generate on perturbed weights (multi-chunk prompts, chunk and bucket sizes, user
caches, EOS lists, max_length, generation_config.json), sampling against the exact distribution, streaming, bad
input, and compile behaviour counted by dynamo."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass

import pytest
import torch
import torch._dynamo
import transformers
from torch._dynamo.utils import counters
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from transformers_static import AutoModelForCausalLM, GenerationConfig, StaticCache

from .models.causal_lm_tester import count_graphs, generation_prompt, perturb

VOCAB = 64
ARCHS = ["llama", "mistral", "gpt2", "bloom"]  # RoPE + GQA, sliding window, learned positions, ALiBi
LONG_PADS, LONG_LEN = (0, 5, 13), 40  # two prefill chunks of the default 32


@dataclass
class Checkpoint:
    path: str
    upstream: transformers.PreTrainedModel  # the model saved at `path`, eval mode

    def generate(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """Upstream's greedy generate (its dynamic cache)."""
        return self.upstream.generate(input_ids, do_sample=False, **kwargs)


def upstream_configs() -> dict[str, transformers.PretrainedConfig]:
    sizes = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, eos_token_id=2)
    return {
        "llama": transformers.LlamaConfig(**sizes, num_attention_heads=4, num_key_value_heads=2),
        "mistral": transformers.MistralConfig(**sizes, num_attention_heads=4, num_key_value_heads=1, sliding_window=5),
        "gpt2": transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2
        ),
        "bloom": transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, eos_token_id=2),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    checkpoints = {}
    for name, config in upstream_configs().items():
        torch.manual_seed(0)
        upstream = perturb(transformers.AutoModelForCausalLM.from_config(config).eval(), 0.1)
        path = str(tmp_path_factory.mktemp(name))
        upstream.save_pretrained(path)
        checkpoints[name] = Checkpoint(path, upstream)
    return checkpoints


@pytest.fixture
def llama(checkpoints: dict[str, Checkpoint]):
    return AutoModelForCausalLM.from_pretrained(checkpoints["llama"].path)


def sampler_internals():
    """(filter_logits, next_tokens): the one place this module reaches past the public API, into the logits
    filters and the sampler (repoint here when generation is restructured)."""
    from transformers_static.generation.logits_process import filter_logits, next_tokens

    return filter_logits, next_tokens


# ---------------------------------------------------------------------- greedy, against upstream
@pytest.mark.parametrize("arch", ARCHS)
def test_multi_chunk_prompt_static_and_dynamic_match_upstream(checkpoints: dict[str, Checkpoint], arch: str) -> None:
    """A 40-token left-padded prompt (two prefill chunks): tokens and every step's logits are upstream's, on the
    static and the dynamic path."""
    checkpoint = checkpoints[arch]
    model = AutoModelForCausalLM.from_pretrained(checkpoint.path)
    ids, mask = generation_prompt(VOCAB, left_pads=LONG_PADS, length=LONG_LEN)
    kwargs = dict(attention_mask=mask, max_new_tokens=10, eos_token_id=None, return_dict_in_generate=True)
    expected = checkpoint.generate(ids, output_logits=True, pad_token_id=0, **kwargs)
    for cache_implementation in ("static", "dynamic"):
        ours = model.generate(ids, output_logits=True, cache_implementation=cache_implementation, **kwargs)
        assert torch.equal(ours.sequences, expected.sequences), cache_implementation
        assert len(ours.logits) == 10
        torch.testing.assert_close(torch.stack(ours.logits), torch.stack(expected.logits), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_chunk_and_bucket_sizes_batch_changes_and_bucket_crossing_match_upstream(
    checkpoints: dict[str, Checkpoint], arch: str
) -> None:
    """Chunks of 4 and buckets of 16 on one model, call after call: a prompt of whole chunks; one of three chunks
    with padding reusing that cache (its stale slots must stay masked); a batch of 1 in a request crossing into a
    second bucket; then a batch of 3 in that bucket (a cache sized for another batch must not be reused). Every
    call's tokens are upstream's."""
    checkpoint = checkpoints[arch]
    model = AutoModelForCausalLM.from_pretrained(checkpoint.path)
    ids, mask = generation_prompt(VOCAB)  # [3, 10], left-padded by 0, 4, 7
    other, _ = generation_prompt(VOCAB, left_pads=(0, 0, 0), length=8)
    calls = [
        (other, None, 6),  # 8 + 6 of 16 slots
        (ids, mask, 4),  # 12 (three chunks) + 4: exactly one bucket
        (ids[1:2, 4:], None, 12),  # 8 + 12: two buckets, batch 1
        (ids, mask, 12),  # 12 + 12: two buckets, batch 3
    ]
    for input_ids, attention_mask, new in calls:
        ours = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=new,
            eos_token_id=None,
            prefill_chunk_size=4,
            cache_bucket_size=16,
        )
        expected = checkpoint.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new, eos_token_id=None)
        assert torch.equal(ours, expected), (list(input_ids.shape), new)


def test_user_static_cache_results_match_upstream(checkpoints: dict[str, Checkpoint]) -> None:
    """A StaticCache the user passes is filled and reused: a batch smaller than the cache, then another prompt
    and batch in the same cache (stale slots from the first call), give upstream's tokens."""
    checkpoint = checkpoints["llama"]
    model = AutoModelForCausalLM.from_pretrained(checkpoint.path)
    cache = StaticCache(model.config, max_batch_size=4, max_cache_len=48)
    ids, mask = generation_prompt(VOCAB)
    other, _ = generation_prompt(VOCAB, left_pads=(0, 0), length=6)
    for input_ids, attention_mask in ((ids, mask), (other, None), (ids[:, 2:], mask[:, 2:])):
        ours = model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=8, eos_token_id=None, past_key_values=cache
        )
        expected = checkpoint.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, eos_token_id=None)
        assert torch.equal(ours, expected)
    assert cache.key_cache[0][:3].abs().sum() > 0, "generation must write into the user's cache"


def test_generates_own_cache_starts_each_call_from_zeros(llama) -> None:
    """The cache generate reuses across calls of one bucket is zeroed at each call, as upstream's: what an earlier
    call left in it (here NaN, as after an overflow) cannot reach a later call through a masked key (weight 0, and
    0 * NaN is NaN)."""
    ids, mask = generation_prompt(VOCAB)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, eos_token_id=None)
    expected = llama.generate(ids, **kwargs)
    cache = llama._generation_cache[1]
    for tensor in cache._buffers():
        if tensor.is_floating_point():
            tensor.fill_(float("nan"))
    assert torch.equal(llama.generate(ids, **kwargs), expected)
    assert llama._generation_cache[1] is cache  # the same cache, reused


def eos_candidates(new_tokens: torch.Tensor) -> list[int]:
    """Per row, the first token that no other row generates before it (a row stops on it, alone)."""
    found = []
    for row in range(new_tokens.shape[0]):
        others = torch.cat([new_tokens[:row], new_tokens[row + 1 :]])
        for step in range(new_tokens.shape[1]):
            token = int(new_tokens[row, step])
            if not (others[:, : step + 1] == token).any() and token not in found:
                found.append(token)
                break
    return found


@pytest.mark.parametrize("cache_implementation", ["static", "dynamic"])
def test_eos_lists_match_upstream(checkpoints: dict[str, Checkpoint], cache_implementation: str) -> None:
    """EOS given as a list: a row stops on any of its ids (the second id matters, checked on upstream), and
    generation stops early once every row has stopped, as upstream's output length says."""
    checkpoint = checkpoints["llama"]
    model = AutoModelForCausalLM.from_pretrained(checkpoint.path)
    ids, mask = generation_prompt(VOCAB)
    free_run = checkpoint.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None)
    candidates = eos_candidates(free_run[:, ids.shape[1] :])
    assert len(candidates) == 3, f"greedy runs too alike for this test: {free_run}"
    kwargs = dict(attention_mask=mask, max_new_tokens=12, pad_token_id=0)
    two = checkpoint.generate(ids, eos_token_id=candidates[:2], **kwargs)
    assert not torch.equal(two, checkpoint.generate(ids, eos_token_id=candidates[0], **kwargs))
    every = checkpoint.generate(ids, eos_token_id=candidates, **kwargs)
    assert every.shape[1] < ids.shape[1] + 12, "every row stops early: upstream's output is shorter"
    for eos, expected in ((candidates[:2], two), (candidates, every)):
        ours = model.generate(ids, eos_token_id=eos, cache_implementation=cache_implementation, **kwargs)
        assert torch.equal(ours, expected), eos


@pytest.mark.parametrize(
    ("arch", "length", "kwargs"),
    [("llama", 10, dict(max_length=15)), ("llama", 10, {}), ("gpt2", 50, {})],
    ids=["max_length", "default", "default_within_the_position_table"],
)
def test_max_length_and_the_default_length_match_upstream(
    checkpoints: dict[str, Checkpoint], arch: str, length: int, kwargs: dict
) -> None:
    """`max_length` counts the prompt; with neither it nor max_new_tokens, 20 new tokens, fewer where the position
    table (GPT-2's 64) ends first."""
    ids, mask = generation_prompt(VOCAB, length=length)
    expected = checkpoints[arch].generate(ids, attention_mask=mask, eos_token_id=None, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(checkpoints[arch].path)
    assert torch.equal(model.generate(ids, attention_mask=mask, eos_token_id=None, **kwargs), expected)


def test_generation_config_json_is_read_from_the_checkpoint(checkpoints: dict[str, Checkpoint], tmp_path) -> None:
    """generation_config.json written by upstream (max_new_tokens, an EOS list, a pad id) drives both generates."""
    path = tmp_path / "ckpt"
    shutil.copytree(checkpoints["llama"].path, path)
    ids, mask = generation_prompt(VOCAB)
    free_run = checkpoints["llama"].generate(ids, attention_mask=mask, max_new_tokens=7, eos_token_id=None)
    eos = eos_candidates(free_run[:, ids.shape[1] :])[:2]
    transformers.GenerationConfig(max_new_tokens=7, eos_token_id=eos, pad_token_id=1).save_pretrained(path)
    expected = transformers.AutoModelForCausalLM.from_pretrained(path).eval().generate(ids, attention_mask=mask)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.generation_config.eos_token_id == eos
    assert torch.equal(model.generate(ids, attention_mask=mask), expected)


# ---------------------------------------------------------------------- sampling
DRAWS = 20_000  # independent rows sampled at once
TOP = 8  # the distance is measured over the TOP most likely tokens and the rest lumped together
FALSE_ALARM = 1e-9


def tv_bound(categories: int, draws: int, false_alarm: float) -> float:
    """t with P(TV(empirical, exact) >= t) <= false_alarm for `draws` samples over `categories` outcomes, from the
    Bretagnolle-Huber-Carol inequality P(||p_hat - p||_1 >= 2t) <= 2^k exp(-2 n t^2)."""
    return math.sqrt((categories * math.log(2) + math.log(1 / false_alarm)) / (2 * draws))


def total_variation(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """(TV distance, categories) between the tokens drawn and `probs` `[vocab]`, over the TOP most likely tokens
    and the rest of the support lumped into one category (lumping never increases the distance)."""
    top = probs.argsort(descending=True)[:TOP]
    top = top[probs[top] > 0]
    freq, exact = torch.bincount(tokens, minlength=probs.numel()).double() / tokens.numel(), probs.double()
    rest = (freq[top].sum() - exact[top].sum()).abs()  # = |rest's frequency - rest's probability|
    categories = top.numel() + int(top.numel() < int((probs > 0).sum()))
    return float(((freq[top] - exact[top]).abs().sum() + rest) / 2), categories


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 6, 1.0), (1.3, 0, 0.8)])
def test_sampled_tokens_follow_upstreams_distribution(
    checkpoints: dict[str, Checkpoint], llama, temperature: float, top_k: int, top_p: float
) -> None:
    """20,000 rows of one prompt each sample a first token. The exact distribution is softmax of upstream's
    processed scores (temperature, top-k, top-p) for that prompt. Tokens outside the kept set never appear, and
    the total-variation distance stays below a bound a correct sampler crosses with probability < 1e-9
    (0.026 for 9 categories), where a wrong race, argmax(p * E) instead of argmax(p / E), sits 0.085 (top-6)
    to 0.47 (all 64 tokens) away."""
    prompt = torch.tensor([[5, 17, 33, 8, 41]])
    sampling = dict(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1)
    scores = (
        checkpoints["llama"]
        .upstream.generate(
            prompt, output_scores=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0, **sampling
        )
        .scores[0][0]
    )
    probs = scores.float().softmax(-1)  # [vocab]
    rows = prompt.expand(DRAWS, -1)
    tokens = llama.generate(
        rows,
        generator=torch.Generator().manual_seed(0),
        eos_token_id=None,
        prefill_chunk_size=5,
        cache_bucket_size=8,
        **sampling,
    )[:, -1]
    assert (probs[tokens] > 0).all(), "a token outside the top-k / top-p set was sampled"
    distance, categories = total_variation(tokens, probs)
    assert distance < tv_bound(categories, DRAWS, FALSE_ALARM)


def exponential_race_wrong_by_product(probs: torch.Tensor, draws: int) -> torch.Tensor:
    """What the sampler would draw were its race argmax(p * E) instead of argmax(p / E) (E ~ Exp(1))."""
    noise = torch.empty(draws, probs.numel()).exponential_(1, generator=torch.Generator().manual_seed(1))
    return (probs * noise).argmax(-1)


def test_sampler_draws_from_the_distribution_it_is_given() -> None:
    """The sampler alone, on a distribution written out (0.5, 0.25, 0.1, 0.1, 0.05): within the bound, while the
    wrong race (argmax(p * E)) lands far outside it (0.11 away; the bound is 0.025)."""
    _, next_tokens = sampler_internals()
    probs = torch.tensor([0.5, 0.25, 0.1, 0.1, 0.05])
    logits = probs.log().expand(DRAWS, -1)
    tokens = next_tokens(logits, True, torch.Generator().manual_seed(0))  # the scores as given: no warper
    bound = tv_bound(probs.numel(), DRAWS, FALSE_ALARM)
    assert total_variation(tokens, probs)[0] < bound
    assert total_variation(exponential_race_wrong_by_product(probs, DRAWS), probs)[0] > 2 * bound


def test_sampling_is_reproducible_under_a_seed(llama) -> None:
    """The same generator seed (or global seed, without a generator) gives the same tokens; another, others."""
    ids, mask = generation_prompt(VOCAB)
    kwargs = dict(attention_mask=mask, max_new_tokens=10, do_sample=True, temperature=1.5, top_k=20, top_p=0.9)
    first = llama.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    second = llama.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    other = llama.generate(ids, generator=torch.Generator().manual_seed(8), **kwargs)
    assert torch.equal(first, second)
    assert not torch.equal(first, other)
    global_runs = []
    for _ in range(2):
        torch.manual_seed(7)
        global_runs.append(llama.generate(ids, **kwargs))
    assert torch.equal(*global_runs)


def test_top_k_1_sampling_equals_greedy(llama) -> None:
    ids, mask = generation_prompt(VOCAB)
    greedy = llama.generate(ids, attention_mask=mask, max_new_tokens=10)
    sampled = llama.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=1, temperature=3.0)
    assert torch.equal(greedy, sampled)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 5, 1.0), (1.0, 0, 0.8), (1.3, 10, 0.5)])
def test_logit_filters_match_upstream_warpers(temperature: float, top_k: int, top_p: float) -> None:
    filter_logits, _ = sampler_internals()
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(torch.isinf(filter_logits(logits, config)), torch.isinf(expected))
    torch.testing.assert_close(filter_logits(logits, config), expected)


# ---------------------------------------------------------------------- streaming, errors, compile
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


def test_unknown_generation_argument_is_an_error(llama) -> None:
    with pytest.raises(ValueError, match=r"Unknown generation argument\(s\) \['max_new_token'\]"):
        llama.generate(torch.tensor([[4, 5]]), max_new_token=3)


def test_bad_input_gives_clear_errors(checkpoints: dict[str, Checkpoint], llama) -> None:
    ids = torch.tensor([[4, 5, 6], [7, 8, 9]])
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \[2, 3\]"):
        llama.generate(ids, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size 2 is larger than the given StaticCache's max_batch_size 1"):
        llama.generate(ids, past_key_values=StaticCache(llama.config, 1, 64))
    with pytest.raises(ValueError, match="the given StaticCache holds 40 tokens but generation needs 42"):
        llama.generate(ids, max_new_tokens=10, past_key_values=StaticCache(llama.config, 2, 40))
    gpt2 = AutoModelForCausalLM.from_pretrained(checkpoints["gpt2"].path)
    with pytest.raises(ValueError, match="65 positions requested .* position table has 64"):
        gpt2.generate(ids, max_new_tokens=62)


def test_classic_growing_mask_compiles_a_graph_per_step(llama) -> None:
    """The problem this library solves, measured: the dynamic path's mask grows, so every step is a new graph."""
    ids, mask = generation_prompt(VOCAB)
    call = dict(
        input_ids=ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None, cache_implementation="dynamic"
    )
    with torch._dynamo.config.patch(recompile_limit=64):
        counts, _ = count_graphs(llama, [call], backend="eager")
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
