"""GenerationConfig: every upstream field known and documented, refusals named, files round-tripped without changing
upstream's behaviour, upstream's object or a dict accepted, upstream's default lengths."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import transformers

import transformers_static
from transformers_static import AutoModelForCausalLM, GenerationConfig
from transformers_static.generation import configuration_utils

from ..models.causal_lm_tester import generation_prompt
from .conftest import VOCAB, Pair

DOCS = Path(__file__).parents[2] / "docs" / "GENERATION.md"
METADATA = {"transformers_version", "_from_model_config"}


def upstream_fields() -> set[str]:
    return {k for k in transformers.GenerationConfig().__dict__ if not k.startswith("_")} - METADATA


def test_every_upstream_field_is_known_and_has_one_row_in_the_docs_table() -> None:
    assert upstream_fields() <= GenerationConfig.field_names()
    assert GenerationConfig.field_names() - upstream_fields() == {"cache_bucket_size"}
    table = DOCS.read_text().split("## The fields")[1].split("## Arguments")[0]
    rows = re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)
    assert sorted(rows) == sorted(GenerationConfig.field_names())


REFUSED = [
    ("penalty_alpha", 0.6),
    ("use_mtp", True),
    ("assistant_early_exit", 1),
    ("is_assistant", True),
    ("dola_layers", "low"),
    ("constraints", ["phrase"]),
    ("force_words_ids", [[5]]),
    ("guidance_scale", 1.5),
    ("watermarking_config", {"bias": 2.0}),
    ("token_healing", True),
    ("output_attentions", True),
    ("output_hidden_states", True),
    ("cache_implementation", "offloaded"),
    ("compile_config", {"fullgraph": True}),
    ("continuous_batching_config", {"max_batch_tokens": 8}),
]


@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_refused_value_names_field_and_value(llama: Pair, name: str, value: object) -> None:
    with pytest.raises(NotImplementedError, match=re.escape(f"{name}={value!r}")):
        llama.ours.generate(torch.tensor([[4, 5]]), max_new_tokens=2, **{name: value})


def test_refused_generate_argument(llama: Pair) -> None:
    with pytest.raises(NotImplementedError, match="prefix_allowed_tokens_fn=<function>.*prefix-constrained decoding"):
        llama.ours.generate(torch.tensor([[4, 5]]), max_new_tokens=2, prefix_allowed_tokens_fn=lambda *a: [1])


def copy_checkpoint(source: str, target: Path, generation_config: dict | None) -> str:
    shutil.copytree(source, target)
    if generation_config is not None:
        (target / "generation_config.json").write_text(json.dumps(generation_config))
    return str(target)


def test_refused_value_in_a_checkpoint_warns_on_read_and_raises_on_generate(
    llama: Pair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = copy_checkpoint(llama.path, tmp_path / "beams", {"num_beams": 4, "do_sample": True, "eos_token_id": 2})
    with caplog.at_level(logging.WARNING):
        model = AutoModelForCausalLM.from_pretrained(path)
    assert "beam sampling" in caplog.text
    with pytest.raises(NotImplementedError, match="do_sample=True"):
        model.generate(torch.tensor([[4, 5]]), max_new_tokens=2)
    assert model.generate(torch.tensor([[4, 5]]), max_new_tokens=2, num_beams=1, do_sample=False).shape == (1, 4)


def test_unknown_keys_round_trip_and_warn_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    original = {"temperature": 0.7, "pad_token_id": None, "my_sampler_knob": [1, 2], "transformers_version": "4.40.0"}
    (tmp_path / "generation_config.json").write_text(json.dumps(original))
    with caplog.at_level(logging.WARNING):
        config = GenerationConfig.from_pretrained(tmp_path)
        GenerationConfig.from_pretrained(tmp_path)
    assert caplog.text.count("'my_sampler_knob'") == 1
    config.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "generation_config.json").read_text()) == original


def test_upstream_behaves_the_same_after_our_round_trip(llama: Pair, tmp_path: Path) -> None:
    """A checkpoint with a published-style generation_config.json, loaded and saved by us: every key kept, upstream
    reads an equal config (no static cache, no max_length added) and generates the same tokens."""
    published = {"bos_token_id": 1, "eos_token_id": [2, 3], "repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
    published.update(do_sample=False, top_p=0.9, transformers_version="4.45.0", custom_flag=True)
    source = copy_checkpoint(llama.path, tmp_path / "source", published)
    AutoModelForCausalLM.from_pretrained(source).save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "generation_config.json").read_text())
    assert saved == published
    before, after = (transformers.GenerationConfig.from_pretrained(p) for p in (source, tmp_path / "ours"))
    assert before == after and after.cache_implementation is None and after.max_length is None
    ids, mask = generation_prompt(VOCAB)
    outputs = [
        transformers.AutoModelForCausalLM.from_pretrained(p).generate(ids, attention_mask=mask, max_new_tokens=6)
        for p in (source, tmp_path / "ours")
    ]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_model_built_from_config_has_a_generation_config_upstream_reads_back(tmp_path: Path) -> None:
    config = transformers_static.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    config.eos_token_id, config.pad_token_id = 2, 0
    model = transformers_static.LlamaForCausalLM(config)
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (2, 0)
    model.save_pretrained(tmp_path)
    loaded = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 0)
    assert loaded.cache_implementation is None and loaded.max_length is None and loaded._from_model_config


def test_generation_config_can_be_upstreams_object_or_a_dict(llama: Pair) -> None:
    ids, mask = generation_prompt(VOCAB)
    fields = dict(max_new_tokens=6, repetition_penalty=1.5, no_repeat_ngram_size=2)
    expected = llama.ours.generate(ids, attention_mask=mask, **fields)
    for config in (transformers.GenerationConfig(**fields), fields, GenerationConfig(**fields)):
        torch.testing.assert_close(llama.ours.generate(ids, attention_mask=mask, generation_config=config), expected)
    torch.testing.assert_close(
        llama.upstream.generate(ids, attention_mask=mask, generation_config=transformers.GenerationConfig(**fields)),
        expected,
    )


def test_model_generation_config_may_be_upstreams_object(llama: Pair) -> None:
    model = AutoModelForCausalLM.from_pretrained(llama.path)
    model.generation_config = transformers.GenerationConfig(max_new_tokens=3, eos_token_id=None)
    assert model.generate(torch.tensor([[4, 5]])).shape == (1, 5)


def generate_both(pair: Pair, ids: torch.Tensor, mask: torch.Tensor, **kwargs: object) -> list[torch.Tensor]:
    """Ours and upstream's tokens, each checked to warn as the other does."""
    outputs, messages = [], []
    for model in (pair.ours, pair.upstream):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outputs.append(model.generate(ids, attention_mask=mask, eos_token_id=None, pad_token_id=0, **kwargs))
        messages.append(sorted(str(w.message) for w in caught if "max_length" in str(w.message)))
    assert messages[0] == messages[1]
    return outputs


@pytest.mark.parametrize(
    ("kwargs", "new_tokens"),
    [({}, 20), ({"max_length": 40}, 3), ({"max_new_tokens": 4}, 4), ({"max_position_embeddings": 45}, 8)],
)
def test_lengths_follow_upstreams_rules(llama: Pair, kwargs: dict, new_tokens: int) -> None:
    """A 37-token prompt: 20 new tokens by default, with upstream's warning, capped by max_position_embeddings."""
    ids, mask = generation_prompt(VOCAB, length=37)
    limit = kwargs.pop("max_position_embeddings", None)
    configs = (llama.ours.config, llama.upstream.config)
    saved = [c.max_position_embeddings for c in configs]
    try:
        for c in configs:
            c.max_position_embeddings = limit or c.max_position_embeddings
        ours, theirs = generate_both(llama, ids, mask, **kwargs)
    finally:
        for c, value in zip(configs, saved, strict=True):
            c.max_position_embeddings = value
    assert ours.shape == (3, 37 + new_tokens)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_prompt_longer_than_max_length_is_upstreams_error(llama: Pair) -> None:
    ids, mask = generation_prompt(VOCAB, length=37)
    for model in (llama.ours, llama.upstream):
        with pytest.raises(ValueError, match="Input length of input_ids is 37, but `max_length` is set to 20"):
            model.generate(ids, attention_mask=mask, max_length=20)


def test_compile_contradicting_disable_compile_is_an_error(llama: Pair) -> None:
    with pytest.raises(ValueError, match="disable_compile"):
        llama.ours.generate(torch.tensor([[4, 5]]), max_new_tokens=2, disable_compile=True, compile=True)


def test_saved_file_holds_only_what_was_set(tmp_path: Path) -> None:
    GenerationConfig(max_new_tokens=5, top_k=None).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {"max_new_tokens": 5}
    assert not os.path.exists(tmp_path / "config.json")


def test_layering_is_kwargs_then_passed_config_then_the_models(llama: Pair) -> None:
    model = AutoModelForCausalLM.from_pretrained(llama.path)
    model.generation_config = GenerationConfig(max_new_tokens=3, eos_token_id=None, repetition_penalty=1.4)
    ids = torch.tensor([[4, 5]])
    assert model.generate(ids).shape == (1, 5)
    passed = transformers.GenerationConfig(max_new_tokens=4)
    assert model.generate(ids, generation_config=passed).shape == (1, 6)  # eos stays unset: the model's None
    assert model.generate(ids, generation_config=passed, max_new_tokens=5).shape == (1, 7)
    torch.testing.assert_close(
        model.generate(ids, generation_config=passed),
        llama.upstream.generate(ids, max_new_tokens=4, eos_token_id=None, repetition_penalty=1.4),
    )


IGNORED_FLAG_CASES = [
    dict(temperature=0.5),
    dict(do_sample=False, temperature=0.5),
    dict(do_sample=False, top_p=0.9, top_k=10, min_p=0.1, typical_p=0.5, epsilon_cutoff=1e-3, eta_cutoff=1e-3),
    dict(do_sample=False, top_k=50, temperature=1.0),  # upstream's neutral values: nothing to say
    dict(do_sample=True, temperature=0.5, top_k=3),
    dict(length_penalty=2.0, early_stopping=True),
    dict(num_beams=1, length_penalty=1.0),
    dict(use_cache=False, cache_implementation="static"),
    dict(output_scores=True, output_logits=True),
    dict(output_scores=True, return_dict_in_generate=True),
    dict(pad_token_id=-1),
]


def upstreams_ignored_flags(values: dict, user_set: set[str]) -> list[str]:
    """The fields upstream's validate lists as not valid (its strict mode raises with one line per field)."""
    config = transformers.GenerationConfig()
    for key, value in values.items():
        setattr(config, key, value)
    try:
        config.validate(strict=True, user_set_attributes=user_set)
    except ValueError as err:
        return re.findall(r"^- `(\w+)`:", str(err), flags=re.MULTILINE)
    return []


@pytest.mark.parametrize("kwargs", IGNORED_FLAG_CASES, ids=lambda kw: ",".join(kw))
def test_ignored_flags_are_upstreams(kwargs: dict) -> None:
    ours = GenerationConfig(**kwargs).ignored_flags(set(kwargs))
    assert sorted(ours) == sorted(upstreams_ignored_flags(kwargs, set(kwargs)))


def test_ignored_flags_from_the_models_config_are_named_unless_the_call_decides(
    llama: Pair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint's sampling values under greedy decoding are warned about, as upstream, unless the call sets
    do_sample itself (then values it inherits are harmless)."""
    model = AutoModelForCausalLM.from_pretrained(llama.path)
    model.generation_config = model.generation_config.update(do_sample=False, top_p=0.8)
    values = dict(do_sample=False, top_p=0.8)
    assert upstreams_ignored_flags(values, set()) == ["top_p"]
    assert upstreams_ignored_flags(values, {"do_sample"}) == []
    ids = torch.tensor([[5, 6, 7]])
    configuration_utils._warned.clear()
    with caplog.at_level(logging.WARNING):
        model.generate(ids, max_new_tokens=2, do_sample=False)
    assert "not valid" not in caplog.text
    with caplog.at_level(logging.WARNING):
        model.generate(ids, max_new_tokens=2)
    assert "The following generation flags are not valid and may be ignored: ['top_p']." in caplog.text
