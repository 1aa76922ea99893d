"""Stop strings against upstream's StopStringCriteria, on a byte-level BPE tokenizer and a model of its vocabulary."""

from __future__ import annotations

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from transformers_static import AutoModelForCausalLM

from .conftest import Pair, save_noisy

TEXT = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs"


@pytest.fixture(scope="module")
def tokenizer() -> transformers.PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>", "<pad>"]
    )
    backend.train_from_iterator([TEXT] * 20, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", padding_side="left"
    )


@pytest.fixture(scope="module")
def pair(tokenizer: transformers.PreTrainedTokenizerFast, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4
    )
    path = str(tmp_path_factory.mktemp("bpe-llama"))
    save_noisy(transformers.LlamaForCausalLM(config), path)
    return Pair(path, transformers.LlamaForCausalLM.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path))


def spanning_stop_string(tokenizer: transformers.PreTrainedTokenizerFast, new_tokens: torch.Tensor) -> str:
    """Two printable ASCII characters across two consecutive new tokens of some row: a stop string that a
    token-level check would miss."""
    for row in new_tokens.tolist():
        texts = [tokenizer.decode([t]) for t in row]
        for prev, text in zip(texts[:-1], texts[1:], strict=True):
            if prev[-1:].isascii() and prev[-1:].isprintable() and text[:1].isascii() and text[:1].isprintable():
                return prev[-1] + text[0]
    raise AssertionError(f"no two consecutive printable tokens in {new_tokens}: pick another seed")


def test_stop_strings_stop_rows_where_upstream_does(
    pair: Pair, tokenizer: transformers.PreTrainedTokenizerFast
) -> None:
    batch = tokenizer(["the lazy dog", "pack my", "five dozen liquor"], padding=True, return_tensors="pt")
    kwargs = dict(attention_mask=batch.attention_mask, max_new_tokens=10, eos_token_id=tokenizer.eos_token_id)
    kwargs["pad_token_id"] = tokenizer.pad_token_id
    ids = batch.input_ids
    plain = pair.ours.generate(ids, **kwargs)
    stop = spanning_stop_string(tokenizer, plain[:, ids.shape[1] :])
    stop_strings = [stop, "dozen"]  # "dozen" is in a prompt: it stops nothing, not overlapping a new token
    ours = pair.ours.generate(ids, stop_strings=stop_strings, tokenizer=tokenizer, **kwargs)
    theirs = pair.upstream.generate(ids, stop_strings=stop_strings, tokenizer=tokenizer, **kwargs)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert not torch.equal(ours, plain[:, : ours.shape[1]]) or ours.shape != plain.shape


def test_stop_strings_need_a_tokenizer(pair: Pair) -> None:
    with pytest.raises(ValueError, match="no tokenizer was given"):
        pair.ours.generate(torch.tensor([[5, 6]]), max_new_tokens=3, stop_strings=["ab"])
