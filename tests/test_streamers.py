"""TextStreamer / TextIteratorStreamer against upstream's: the same chunks, released at the same tokens (word
boundaries, newlines, CJK characters, partial UTF-8 bytes), prompt skipping, decode kwargs and timeouts."""

import asyncio
import contextlib
import io
import queue
import threading

import pytest
import torch
import transformers

import transformers_static
from transformers_static import AutoTokenizer

from . import tokenizer_fixtures as fixtures

TEXT = "Hello world, 中文字符 and emoji 🎉🙂 here.\nNew line  two spaces 日本語\n\nend <|im_end|> tail"


@pytest.fixture(scope="module", params=["smollm", "llama2"])
def pair(request, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    build = {"smollm": fixtures.smollm_tokenizer, "llama2": fixtures.llama2_tokenizer}[request.param]
    path = build(str(tmp_path_factory.mktemp("streamers") / request.param))
    return transformers.AutoTokenizer.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def stream(library, tokenizer, ids: list[int], prompt_len: int, **kwargs) -> list[str]:
    """Feed `ids` to an iterator streamer as generate does (prompt, then one token per step, then end)."""
    streamer = library.TextIteratorStreamer(tokenizer, timeout=5.0, **kwargs)
    streamer.put(torch.tensor([ids[:prompt_len]]))
    for token in ids[prompt_len:]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    return list(streamer)


@pytest.mark.parametrize("kwargs", [{}, {"skip_prompt": True}, {"skip_prompt": True, "skip_special_tokens": True}])
def test_chunks_match_upstream(pair, kwargs) -> None:
    theirs, ours = pair
    ids = theirs(TEXT)["input_ids"]
    expected = stream(transformers, theirs, ids, 3, **kwargs)
    assert stream(transformers_static, ours, ids, 3, **kwargs) == expected
    assert len(expected) == len(ids) - 3 + 1 + (0 if kwargs else 1)  # a chunk per put, plus end's flush
    assert any(c == "" for c in expected) and any(c.endswith("\n") for c in expected)


def test_text_streamer_prints_like_upstream(pair) -> None:
    theirs, ours = pair
    ids = torch.tensor([theirs(TEXT)["input_ids"]])
    outputs = []
    for library, tokenizer in ((transformers, theirs), (transformers_static, ours)):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            streamer = library.TextStreamer(tokenizer, skip_prompt=False)
            streamer.put(ids[:, :2])
            for token in ids[0, 2:]:
                streamer.put(token[None])
            streamer.end()
        outputs.append(buffer.getvalue())
    assert outputs[1] == outputs[0] and outputs[0].endswith("\n")


def test_iterator_streamer_from_a_thread_and_timeout(pair) -> None:
    _, ours = pair
    streamer = transformers_static.TextIteratorStreamer(ours, skip_prompt=True, timeout=30.0)
    ids = ours("one two three")["input_ids"]

    def produce() -> None:
        streamer.put(torch.tensor([ids]))
        for token in ids:
            streamer.put(torch.tensor([token]))
        streamer.end()

    thread = threading.Thread(target=produce)
    thread.start()
    text = "".join(streamer)
    thread.join()
    assert text == ours.decode(ids)
    idle = transformers_static.TextIteratorStreamer(ours, timeout=0.05)
    with pytest.raises(queue.Empty):
        next(idle)
    with pytest.raises(ValueError, match="only supports batch size 1"):
        streamer.put(torch.tensor([[1], [2]]))


def test_async_iterator_streamer_matches_upstream(pair) -> None:
    theirs, ours = pair
    ids = theirs(TEXT)["input_ids"]

    async def collect(library, tokenizer) -> list[str]:
        streamer = library.AsyncTextIteratorStreamer(tokenizer, skip_prompt=True, timeout=5.0)

        def produce() -> None:
            streamer.put(torch.tensor([ids[:2]]))
            for token in ids[2:]:
                streamer.put(torch.tensor([token]))
            streamer.end()

        thread = threading.Thread(target=produce)
        thread.start()
        chunks = [chunk async for chunk in streamer]
        thread.join()
        return chunks

    assert asyncio.run(collect(transformers_static, ours)) == asyncio.run(collect(transformers, theirs))
