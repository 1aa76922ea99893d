"""The drop-in promise: an upstream inference script, with only `import transformers` changed to
`import transformers_static as transformers`, prints exactly what it prints with upstream transformers (a tiny random
upstream Llama checkpoint and real tokenizers built in the test)."""

import contextlib
import io
import json
import os

import pytest
import torch
import transformers

import transformers_static

from . import tokenizer_fixtures as fixtures

CHAT_SCRIPT = """
import transformers
from threading import Thread

tok = transformers.AutoTokenizer.from_pretrained(CKPT)
model = transformers.AutoModelForCausalLM.from_pretrained(CKPT)
messages = [{"role": "user", "content": "What is the capital of France? Réponds 🙂"}]

# chat template + generate + batch_decode
print(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt").to(model.device)
out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
print(out.tolist())
print(tok.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True))

# a left-padded batch
tok.padding_side = "left"
batch = tok(["Hello world", "A much longer prompt about Paris, France and 中文", "Hi"], padding=True, return_tensors="pt")
print(batch["attention_mask"].tolist())
out = model.generate(**batch, max_new_tokens=10, do_sample=False)
print(tok.batch_decode(out, skip_special_tokens=True))

# streamers: every chunk as released, the printed stream, and an iterator fed from a thread
class Show(transformers.TextStreamer):
    def on_finalized_text(self, text, stream_end=False):
        print(repr(text), stream_end)

model.generate(**inputs, max_new_tokens=24, do_sample=False, streamer=Show(tok, skip_prompt=True, skip_special_tokens=True))
model.generate(**inputs, max_new_tokens=12, do_sample=False, streamer=transformers.TextStreamer(tok))
streamer = transformers.TextIteratorStreamer(tok, skip_prompt=True, timeout=60.0)
thread = Thread(target=model.generate, kwargs=dict(**inputs, streamer=streamer, max_new_tokens=16, do_sample=False))
thread.start()
print(list(streamer))
thread.join()

# pipeline: a string, chat messages, a list of strings, a list of chats (one continuing the assistant)
pipe = transformers.pipeline("text-generation", model=CKPT, tokenizer=tok)
print(pipe("Once upon a time", max_new_tokens=10, do_sample=False))
print(pipe(messages, max_new_tokens=10, do_sample=False))
print(pipe(["Once", "upon a"], max_new_tokens=5, do_sample=False, return_full_text=False))
print(pipe([messages, messages + [{"role": "assistant", "content": "Paris"}]], max_new_tokens=5, do_sample=False))
print(pipe("Tensors", max_new_tokens=3, do_sample=False, return_tensors=True))
"""

# A Llama-2 style tokenizer (LlamaTokenizer, <s> prepended, byte fallback) and a pipeline built from the model object.
LLAMA2_SCRIPT = """
import transformers

tok = transformers.AutoTokenizer.from_pretrained(CKPT)
model = transformers.AutoModelForCausalLM.from_pretrained(CKPT)
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour 🎨"}]
ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
print(ids)
out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
print(tok.decode(out[0]), tok.decode(out[0], skip_special_tokens=True))
tok.pad_token = tok.eos_token
batch = tok(["short", "a longer one with ünïcode"], padding=True, padding_side="left", return_tensors="pt")
print(tok.batch_decode(model.generate(**batch, max_new_tokens=6, do_sample=False)))
pipe = transformers.pipeline("text-generation", model=model, tokenizer=tok, device="cpu", max_new_tokens=6)
print(pipe("The sky is", do_sample=False), pipe("The sky is", do_sample=False, batch_size=2))
print(pipe(["a", "bb bb", "ccc"], do_sample=False, batch_size=2, return_full_text=False))
"""


def run_script(script: str, module_line: str, checkpoint: str) -> str:
    """Exec `script` with its `import transformers` replaced by `module_line`; returns what it printed."""
    source = script.replace("import transformers\n", module_line + "\n", 1)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(source, "<script>", "exec"), {"__name__": "__main__", "CKPT": checkpoint, "torch": torch})
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("script", "tokenizer_builder"),
    [(CHAT_SCRIPT, fixtures.smollm_tokenizer), (LLAMA2_SCRIPT, fixtures.llama2_tokenizer)],
    ids=["smollm_chat", "llama2"],
)
def test_same_script_prints_the_same(script, tokenizer_builder, tmp_path) -> None:
    checkpoint = fixtures.tiny_llama_checkpoint(str(tmp_path / "ckpt"), tokenizer_builder)
    expected = run_script(script, "import transformers", checkpoint)
    got = run_script(script, "import transformers_static as transformers", checkpoint)
    assert got == expected
    assert "generated_text" in expected


def test_pipeline_refuses_other_tasks_and_options(tmp_path) -> None:
    with pytest.raises(
        ValueError, match="'summarization' is not supported .* only supported task is 'text-generation'"
    ):
        transformers_static.pipeline("summarization", model="whatever")
    with pytest.raises(ValueError, match="needs model="):
        transformers_static.pipeline("text-generation")
    checkpoint = fixtures.tiny_llama_checkpoint(str(tmp_path / "ckpt"), fixtures.gpt2_tokenizer)
    model = transformers_static.AutoModelForCausalLM.from_pretrained(checkpoint)
    with pytest.raises(ValueError, match="needs tokenizer="):
        transformers_static.pipeline("text-generation", model=model)
    pipe = transformers_static.pipeline(model=checkpoint, device="cpu")
    assert pipe.task == "text-generation"
    with pytest.raises(NotImplementedError, match="stop_sequence"):
        pipe("x", stop_sequence="y")
    with pytest.raises(NotImplementedError, match=r"do_sample=True \(with num_beams=2: beam sampling\)"):
        pipe("x", num_beams=2, max_new_tokens=2)  # the pipeline samples by default; beams with sampling are refused
    assert len(pipe("x", num_beams=2, do_sample=False, max_new_tokens=2)) == 1
    with pytest.raises(ValueError, match="cannot do batching"):
        pipe(["x", "y"], batch_size=2, max_new_tokens=2)


GENERATION_CASES = [
    ({}, {}),
    ({}, {"do_sample": False}),
    ({}, {"max_length": 30}),
    ({"max_new_tokens": 5}, {"temperature": 0.2}),
    ({"do_sample": False}, {"top_k": 3}),
]


@pytest.mark.parametrize(
    "generation_config",
    [{}, {"do_sample": True, "temperature": 0.2, "top_p": 0.9, "max_new_tokens": 8}],
    ids=["no_generation_config", "sampling_generation_config"],
)
def test_pipeline_passes_generate_what_upstream_passes(generation_config, tmp_path) -> None:
    """The pipeline's defaults (256 new tokens, sampling at 0.7, the tokenizer's pad id) fill only what neither the
    call, the construction nor the model's generation config set: the same generate kwargs as upstream's."""
    checkpoint = fixtures.tiny_llama_checkpoint(str(tmp_path / "ckpt"))
    config_file = os.path.join(checkpoint, "config.json")
    with open(config_file) as f:
        config = {k: v for k, v in json.load(f).items() if k != "pad_token_id"}
    with open(config_file, "w") as f:
        json.dump(config, f)
    with open(os.path.join(checkpoint, "generation_config.json"), "w") as f:
        json.dump(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"], **generation_config}, f
        )
    for init_kwargs, call_kwargs in GENERATION_CASES:
        recorded = []
        for library in (transformers, transformers_static):
            pipe = library.pipeline("text-generation", model=checkpoint, device="cpu", **init_kwargs)
            calls = []

            def fake_generate(input_ids, attention_mask=None, calls=calls, **kwargs):
                calls.append(kwargs)
                return torch.cat([input_ids, input_ids[:, :1]], dim=1)

            pipe.model.generate = fake_generate
            pipe("Hello", **call_kwargs)
            recorded.append(calls[0])
        assert recorded[1] == recorded[0], (init_kwargs, call_kwargs)
