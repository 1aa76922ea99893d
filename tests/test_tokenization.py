"""AutoTokenizer against upstream's on real tokenizers built in the test: the same class, backend pipeline, ids,
decoded text, padding, truncation, special tokens and saved files."""

import json
import os
import shutil
import sys

import pytest
import torch
import transformers
from tokenizers import Tokenizer

import transformers_static
from transformers_static import (
    AutoTokenizer,
    BatchEncoding,
    GPT2Tokenizer,
    PreTrainedTokenizerFast,
    TokenizersBackend,
)

from . import tokenizer_fixtures as fixtures

# name -> (builder, kwargs): each loads through a different upstream class or path.
KINDS = {
    "gpt2_byte_level": (fixtures.gpt2_tokenizer, {}),
    "gpt2_as_is": (fixtures.gpt2_tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast"}),
    "gpt2_json_padding": (
        fixtures.gpt2_tokenizer,
        {"tokenizer_class": "PreTrainedTokenizerFast", "json_settings": True},
    ),
    "gpt2_json_padding_rebuilt": (fixtures.gpt2_tokenizer, {"json_settings": True}),
    "smollm_chat": (fixtures.smollm_tokenizer, {}),
    "smollm_as_is": (fixtures.smollm_tokenizer, {"tokenizer_class": "TokenizersBackend"}),
    "llama2_byte_fallback": (fixtures.llama2_tokenizer, {}),
    "llama2_legacy": (fixtures.llama2_tokenizer, {"legacy": True, "add_prefix_space": True}),
    "llama2_as_is": (fixtures.llama2_tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast"}),
    "unigram": (fixtures.unigram_tokenizer, {}),
    "qwen2_hub_class_overridden": (fixtures.qwen2_tokenizer, {}),
    "qwen3_5": (fixtures.qwen3_5_tokenizer, {}),
    "gpt_neox": (fixtures.neox_tokenizer, {}),
    "gemma": (fixtures.gemma_tokenizer, {}),
    "cohere": (fixtures.cohere_tokenizer, {}),
    "openai_gpt": (fixtures.openai_gpt_tokenizer, {}),
    "xglm": (fixtures.xglm_tokenizer, {}),
}
ATTRIBUTES = [
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "mask_token",
    "bos_token_id",
    "eos_token_id",
    "unk_token_id",
    "pad_token_id",
    "vocab_size",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "clean_up_tokenization_spaces",
    "special_tokens_map",
    "all_special_tokens",
    "all_special_ids",
    "extra_special_tokens",
    "model_input_names",
    "chat_template",
    "add_bos_token",
    "add_eos_token",
]


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: build(str(root / name), **kwargs) for name, (build, kwargs) in KINDS.items()}


def load_pair(path: str, **kwargs) -> tuple:
    return transformers.AutoTokenizer.from_pretrained(path, **kwargs), AutoTokenizer.from_pretrained(path, **kwargs)


def assert_same_tokenizer(theirs, ours) -> None:
    assert type(ours).__name__ == type(theirs).__name__
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(theirs.backend_tokenizer.to_str())
    for name in ATTRIBUTES:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert len(ours) == len(theirs)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.added_tokens_encoder == theirs.added_tokens_encoder


def as_lists(encoding) -> dict:
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in encoding.items()}


@pytest.fixture(params=sorted(KINDS))
def pair(request, tokenizer_dirs) -> tuple:
    return load_pair(tokenizer_dirs[request.param])


def test_loads_like_upstream(pair) -> None:
    assert_same_tokenizer(*pair)


def test_encode_decode_like_upstream(pair) -> None:
    theirs, ours = pair
    for text in fixtures.TEXTS:
        expected = theirs(text)
        assert dict(ours(text)) == dict(expected), text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        assert ours.tokenize(text) == theirs.tokenize(text)
        ids = expected["input_ids"]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
        assert ours.convert_tokens_to_ids(theirs.convert_ids_to_tokens(ids)) == ids
    with_specials = f"a {theirs.eos_token} b {theirs.unk_token}c"
    assert ours(with_specials)["input_ids"] == theirs(with_specials)["input_ids"]
    for clean in (False, True):  # BPE tokenizers ignore clean-up (with a warning), others apply it
        ids = theirs("Hello , world . It 's ok !")["input_ids"]
        assert ours.decode(ids, clean_up_tokenization_spaces=clean) == theirs.decode(
            ids, clean_up_tokenization_spaces=clean
        )


def test_batches_padding_truncation_like_upstream(pair) -> None:
    theirs, ours = pair
    if theirs.pad_token is None:  # both refuse to pad, then pad with eos (GPT-1: unk) as users do
        for tokenizer in (theirs, ours):
            with pytest.raises(ValueError, match="does not have a padding token"):
                tokenizer(fixtures.TEXTS, padding=True)
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    cases = [
        {"padding": True},
        {"padding": "longest", "padding_side": "left"},
        {"padding": "max_length", "max_length": 12, "truncation": True},
        {"padding": True, "truncation": True, "max_length": 5, "padding_side": "right"},
        {"max_length": 4},
        {"padding": True, "pad_to_multiple_of": 8, "return_attention_mask": False},
        {"return_special_tokens_mask": True, "return_offsets_mapping": True, "return_length": True},
        {"add_special_tokens": False, "return_token_type_ids": True},
    ]
    for case in cases:
        assert as_lists(ours(fixtures.TEXTS, **case)) == as_lists(theirs(fixtures.TEXTS, **case)), case
    expected = theirs(fixtures.TEXTS, padding=True, return_tensors="pt")
    got = ours(fixtures.TEXTS, padding=True, return_tensors="pt")
    assert isinstance(got, BatchEncoding) and got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
    single = ours(fixtures.TEXTS[0], return_tensors="pt")
    assert single["input_ids"].shape == theirs(fixtures.TEXTS[0], return_tensors="pt")["input_ids"].shape
    ragged_ours, ragged_theirs = (
        ours(fixtures.TEXTS[:2], return_tensors="np"),
        theirs(fixtures.TEXTS[:2], return_tensors="np"),
    )
    assert [r.tolist() for r in ragged_ours["input_ids"]] == [r.tolist() for r in ragged_theirs["input_ids"]]
    assert ours("", return_tensors="pt")["input_ids"].dtype == torch.int64
    rows = expected["input_ids"]
    assert ours.batch_decode(rows, skip_special_tokens=True) == theirs.batch_decode(rows, skip_special_tokens=True)
    assert ours.decode(rows) == theirs.decode(rows)
    unpadded = [theirs(t)["input_ids"] for t in fixtures.TEXTS[:3]]
    padded = {"input_ids": unpadded}
    assert as_lists(ours.pad(padded, padding_side="left")) == as_lists(theirs.pad(padded, padding_side="left"))


def test_special_token_changes_like_upstream(pair) -> None:
    theirs, ours = pair
    for tokenizer in (theirs, ours):
        tokenizer.add_special_tokens({"pad_token": "<|pad|>", "extra_special_tokens": ["<tool>"]})
        tokenizer.add_tokens(["newword"])
        tokenizer.eos_token_id = tokenizer.convert_tokens_to_ids("<tool>")
    assert_same_tokenizer(theirs, ours)
    text = "x <tool> newword <|pad|>"
    assert dict(ours(text)) == dict(theirs(text))
    ids = theirs(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)


def test_save_pretrained_round_trips_with_upstream(pair, tmp_path) -> None:
    theirs, ours = pair
    ours.save_pretrained(tmp_path / "ours")
    theirs.save_pretrained(tmp_path / "theirs")
    files = {
        side: sorted(str(f.relative_to(tmp_path / side)) for f in (tmp_path / side).rglob("*") if f.is_file())
        for side in ("ours", "theirs")
    }
    assert files["ours"] == files["theirs"]  # named chat templates in additional_chat_templates/ included
    for name in files["theirs"]:  # the same files, to the byte (configs as JSON)
        ours_text, theirs_text = ((tmp_path / side / name).read_text(encoding="utf-8") for side in ("ours", "theirs"))
        assert json.loads(ours_text) == json.loads(theirs_text) if name.endswith(".json") else ours_text == theirs_text
    # Either library reads what either wrote, and gets the same tokenizer.
    for folder in ("ours", "theirs"):
        reloaded_theirs, reloaded_ours = load_pair(str(tmp_path / folder))
        assert_same_tokenizer(reloaded_theirs, reloaded_ours)


def test_kwargs_override_the_files(tokenizer_dirs) -> None:
    path = tokenizer_dirs["llama2_byte_fallback"]
    kwargs = {"padding_side": "left", "pad_token": "</s>", "add_eos_token": True, "model_max_length": 7}
    theirs, ours = load_pair(path, **kwargs)
    assert_same_tokenizer(theirs, ours)
    assert ours("hi")["input_ids"] == theirs("hi")["input_ids"]
    assert ours("long " * 20, truncation=True)["input_ids"] == theirs("long " * 20, truncation=True)["input_ids"]
    ours.add_bos_token = theirs.add_bos_token = False
    assert ours("hi")["input_ids"] == theirs("hi")["input_ids"]


def test_direct_construction_and_batch_encoding(tokenizer_dirs) -> None:
    path = tokenizer_dirs["gpt2_as_is"]
    ours = PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"), eos_token="<|endoftext|>")
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(path, "tokenizer.json"), eos_token="<|endoftext|>"
    )
    assert PreTrainedTokenizerFast is TokenizersBackend
    assert_same_tokenizer(theirs, ours)
    batch = ours(["a b", "c"], padding=False)
    assert batch.tokens(0) == theirs(["a b", "c"]).tokens(0)
    moved = ours(["a b"], return_tensors="pt").to("cpu")
    assert isinstance(moved, BatchEncoding) and moved.input_ids.device.type == "cpu"
    assert sorted(moved) == ["attention_mask", "input_ids"]


def test_unsupported_inputs_are_clear_errors(tokenizer_dirs, tmp_path) -> None:
    path = tokenizer_dirs["gpt2_byte_level"]
    bad = tmp_path / "bert"
    bad.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(path, name), bad / name)
    config = json.loads((bad / "tokenizer_config.json").read_text())
    (bad / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "BertTokenizer"}))
    (bad / "config.json").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="'BertTokenizer' is not supported.*PreTrainedTokenizerFast"):
        AutoTokenizer.from_pretrained(bad)
    (bad / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    (bad / "tokenizer.json").unlink()
    with pytest.raises(OSError, match="No tokenizer.json in"):
        AutoTokenizer.from_pretrained(bad)
    tokenizer = AutoTokenizer.from_pretrained(path)
    with pytest.raises(TypeError, match="text_target"):
        tokenizer("x", text_target="y")
    with pytest.raises(ValueError, match="not a valid PaddingStrategy"):
        tokenizer(["x"], padding="everything")
    with pytest.raises(ValueError, match="return_tensors must be"):
        tokenizer("x", return_tensors="tf")


def test_missing_tokenizers_library_is_a_clear_error(tokenizer_dirs, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if the [tokenizers] extra were not installed
    with pytest.raises(ImportError, match=r"pip install 'transformers-static\[tokenizers\]'"):
        AutoTokenizer.from_pretrained(tokenizer_dirs["gpt2_byte_level"])


@pytest.mark.parametrize("loader", [AutoTokenizer, GPT2Tokenizer, TokenizersBackend], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "argument",
    [("subfolder", "tok"), ("force_download", False), ("proxies", {"https": "x"}), ("fix_mistral_regex", True)],
)
def test_unsupported_load_arguments_are_refused_by_every_loader(tokenizer_dirs, loader, argument) -> None:
    name, value = argument
    with pytest.raises(NotImplementedError, match=rf"{loader.__name__}\.from_pretrained.*{name}.*not supported"):
        loader.from_pretrained(tokenizer_dirs["gpt2_byte_level"], **{name: value})


def test_ignored_load_arguments_stay_out_of_the_saved_config(tokenizer_dirs, tmp_path, caplog) -> None:
    """trust_remote_code (ignored, with a warning) and fix_mistral_regex=False (upstream's default) are not written
    back as tokenizer settings by any loader."""
    for loader in (AutoTokenizer, GPT2Tokenizer):
        caplog.clear()
        tokenizer = loader.from_pretrained(tokenizer_dirs["gpt2_byte_level"], trust_remote_code=True)
        assert "trust_remote_code=True is ignored" in caplog.text
        tokenizer.save_pretrained(tmp_path / loader.__name__)
        saved = json.loads((tmp_path / loader.__name__ / "tokenizer_config.json").read_text())
        assert "trust_remote_code" not in saved, loader


def test_fix_mistral_regex_in_tokenizer_config_is_refused(tokenizer_dirs, tmp_path) -> None:
    path = tmp_path / "mistral"
    shutil.copytree(tokenizer_dirs["smollm_as_is"], path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "fix_mistral_regex": False}))
    assert AutoTokenizer.from_pretrained(path).init_kwargs["fix_mistral_regex"] is False  # as upstream: kept
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "fix_mistral_regex": True}))
    for loader in (AutoTokenizer, TokenizersBackend):
        with pytest.raises(NotImplementedError, match=r"tokenizer_config.json sets fix_mistral_regex=True.*Mistral"):
            loader.from_pretrained(path)


def test_qwen3_5_keeps_combining_marks_in_words_where_qwen2_splits_them(tokenizer_dirs) -> None:
    """Devanagari vowel signs are marks (\\p{M}): Qwen3.5's split keeps them in the word, Qwen2's does not."""
    text = "नमस्ते दुनिया, hello"
    theirs, ours = load_pair(tokenizer_dirs["qwen3_5"])
    assert type(ours).__name__ == "Qwen3_5Tokenizer"
    assert ours.tokenize(text) == theirs.tokenize(text)

    def words(tokenizer) -> list[str]:
        return [word for word, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]

    assert words(ours) == words(theirs)
    assert len(words(ours)) < len(words(load_pair(tokenizer_dirs["qwen2_hub_class_overridden"])[1]))


@pytest.mark.parametrize(
    "name",
    [
        "CohereTokenizer",
        "GPT2Tokenizer",
        "GemmaTokenizer",
        "OpenAIGPTTokenizer",
        "Qwen2Tokenizer",
        "TokenizersBackend",
    ],
)
def test_tokenizer_object_takes_the_class_defaults_like_upstream(tokenizer_dirs, name) -> None:
    backend = Tokenizer.from_file(os.path.join(tokenizer_dirs["gpt2_as_is"], "tokenizer.json"))
    theirs = getattr(transformers, name)(tokenizer_object=backend)
    ours = getattr(transformers_static, name)(tokenizer_object=backend)
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert (ours.padding_side, ours.add_prefix_space, len(ours)) == (
        theirs.padding_side,
        theirs.add_prefix_space,
        len(theirs),
    )
    assert ours("a <pad> b")["input_ids"] == theirs("a <pad> b")["input_ids"]


def test_cohere_tool_use_and_grounded_prompts_like_upstream(tokenizer_dirs) -> None:
    theirs, ours = load_pair(tokenizer_dirs["cohere"])
    conversation = [{"role": "user", "content": "Who won in 2024?"}]
    tools = [{"name": "internet_search"}, {"name": "directly_answer"}]
    documents = [{"text": "Paris hosted."}, {"text": "Records fell."}]
    for kwargs in ({"tokenize": False}, {}):
        assert ours.apply_tool_use_template(conversation, tools, **kwargs) == theirs.apply_tool_use_template(
            conversation, tools, **kwargs
        )
        for mode in ("accurate", "fast"):
            assert ours.apply_grounded_generation_template(
                conversation, documents, citation_mode=mode, **kwargs
            ) == theirs.apply_grounded_generation_template(conversation, documents, citation_mode=mode, **kwargs)


def test_registered_tokenizer_classes_are_upstreams() -> None:
    """Every model type here registers upstream's tokenizer class (and overrides a wrong Hub class where upstream
    does), so a type upstream gives its own class cannot silently fall back to tokenizer.json as it is."""
    from transformers.models.auto import tokenization_auto as theirs

    from transformers_static.models.auto import tokenization_auto as ours

    model_types = set(transformers_static.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    registered, upstream_registered = ours.TOKENIZER_MAPPING_NAMES, theirs.TOKENIZER_MAPPING_NAMES
    assert registered == {t: upstream_registered[t] for t in model_types if upstream_registered.get(t)}
    overridden = ours.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
    assert overridden == theirs.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS & model_types


@pytest.mark.parametrize(
    ("model_type", "name"),
    [
        ("biogpt", "BioGptTokenizer"),
        ("ctrl", "CTRLTokenizer"),
        ("gpt_neox_japanese", "GPTNeoXJapaneseTokenizer"),
    ],
)
def test_a_registered_class_we_lack_is_refused_by_name(tokenizer_dirs, tmp_path, model_type, name) -> None:
    path = shutil.copytree(tokenizer_dirs["gpt2_byte_level"], tmp_path / model_type)
    with open(path / "config.json", "w", encoding="utf-8") as f:
        json.dump({"model_type": model_type}, f)
    with open(path / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": name}, f)
    with pytest.raises(ValueError, match=f"Tokenizer class '{name}' is not supported by transformers_static"):
        AutoTokenizer.from_pretrained(str(path))
    os.remove(path / "tokenizer_config.json")  # no class stated: the model type's registered one
    with pytest.raises(ValueError, match=f"Tokenizer class '{name}' is not supported"):
        AutoTokenizer.from_pretrained(str(path))
