"""The prompt generate starts from: ids outside the vocabulary, right padding, masks with holes, masks inferred from
the pad id, and a BOS start, against upstream where upstream has the behaviour."""

from __future__ import annotations

import logging

import pytest
import torch

from transformers_static import StaticCache
from transformers_static.cache_utils import DynamicCache
from transformers_static.generation import configuration_utils

from ..models.causal_lm_tester import generation_prompt
from .conftest import VOCAB, Pair

KWARGS = dict(max_new_tokens=6, eos_token_id=None)


def test_ids_outside_the_vocabulary_name_rows_and_size(llama: Pair) -> None:
    ids, mask = generation_prompt(VOCAB)
    ids[1, -1], ids[2, -2] = VOCAB, -3
    with pytest.raises(ValueError, match=r"input_ids rows \[1, 2\] hold token ids outside the vocabulary \[0, 64\)"):
        llama.ours.generate(ids, attention_mask=mask, **KWARGS)
    with pytest.raises(ValueError, match=r"rows \[1, 2\] .*\[0, 64\): \[-3, 64\]"):
        llama.ours(ids)  # an eager forward checks too


def test_padding_ids_outside_the_vocabulary_are_never_fed(llama: Pair) -> None:
    ids, mask = generation_prompt(VOCAB)
    expected = llama.ours.generate(ids, attention_mask=mask, **KWARGS)
    out = llama.ours.generate(ids.masked_fill(mask == 0, -100), attention_mask=mask, **KWARGS)
    torch.testing.assert_close(out[:, ids.shape[1] :], expected[:, ids.shape[1] :], rtol=0, atol=0)


def right_padded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rows with their padding moved to the right."""
    shifts = (mask == 0).sum(-1)
    index = (torch.arange(ids.shape[1]) + shifts[:, None]) % ids.shape[1]
    return ids.gather(1, index), mask.gather(1, index)


def test_right_padding_gives_the_left_padded_tokens_and_warns_once(
    llama: Pair, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(configuration_utils, "_warned", set())
    ids, mask = generation_prompt(VOCAB)
    right_ids, right_mask = right_padded(ids, mask)
    assert right_mask[:, -1].eq(0).any()
    expected = llama.ours.generate(ids, attention_mask=mask, **KWARGS)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            out = llama.ours.generate(right_ids, attention_mask=right_mask, **KWARGS)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert caplog.text.count("Right padding detected") == 1
    torch.testing.assert_close(llama.upstream.generate(ids, attention_mask=mask, **KWARGS), expected, rtol=0, atol=0)


def test_mask_with_holes_names_the_rows(llama: Pair) -> None:
    ids, mask = generation_prompt(VOCAB)
    mask[0, 3] = 0
    mask[2, 8] = 0
    with pytest.raises(ValueError, match=r"attention_mask rows \[0, 2\] have padding between tokens"):
        llama.ours.generate(ids, attention_mask=mask, **KWARGS)


def test_mask_is_inferred_from_the_pad_id_as_upstream(llama: Pair) -> None:
    ids, _ = generation_prompt(VOCAB)  # left padding holds id 0
    kwargs = dict(KWARGS, pad_token_id=0)
    torch.testing.assert_close(
        llama.ours.generate(ids, **kwargs), llama.upstream.generate(ids, **kwargs), rtol=0, atol=0
    )
    with pytest.raises(ValueError, match=r"rows \[0\] have padding between tokens \(no attention_mask given"):
        llama.ours.generate(torch.tensor([[5, 0, 6]]), **kwargs)


def test_no_input_ids_starts_from_bos_as_upstream(llama: Pair) -> None:
    torch.testing.assert_close(llama.ours.generate(**KWARGS), llama.upstream.generate(**KWARGS), rtol=0, atol=0)


def test_past_key_values_other_than_a_static_cache_are_refused(llama: Pair) -> None:
    """A given cache is filled by the static path only: a DynamicCache, or any cache with
    cache_implementation="dynamic", is a ValueError instead of a cache silently left unused."""
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="past_key_values must be a transformers_static StaticCache.*DynamicCache"):
        llama.ours.generate(ids, max_new_tokens=2, past_key_values=DynamicCache())
    cache = StaticCache(llama.ours.config, max_batch_size=1, max_cache_len=64)
    with pytest.raises(ValueError, match="StaticCache with cache_implementation='dynamic'"):
        llama.ours.generate(ids, max_new_tokens=2, past_key_values=cache, cache_implementation="dynamic")
    assert not cache.key_cache[0].any()
    llama.ours.generate(ids, max_new_tokens=2, past_key_values=cache)
    assert cache.key_cache[0].any()  # the static path fills it


def test_generate_steps_read_nothing_back_in_the_forward(llama: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """generate checks ids, cache room and positions once, up front; its prefill and decode forwards then make no
    host read (each would be a device sync per step), while a plain eager forward still checks its inputs."""
    model = llama.ours
    base_forward, forwards, reads = model.model.forward, [], []

    def counted_forward(*args, **kwargs):
        forwards.append(len(reads))
        try:
            return base_forward(*args, **kwargs)
        finally:
            forwards[-1] = len(reads) - forwards[-1]  # host reads during this forward

    def recorded(name: str):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            reads.append(name)
            return original(self, *args, **kwargs)

        return read

    ids, mask = generation_prompt(VOCAB)
    with monkeypatch.context() as patch:
        patch.setattr(model.model, "forward", counted_forward)
        for name in ("__bool__", "tolist", "item", "__int__"):
            patch.setattr(torch.Tensor, name, recorded(name))
        model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=None, pad_token_id=0)
        assert reads  # the up-front checks did read
        assert len(forwards) >= 6 and forwards == [0] * len(forwards)  # prefill chunks, then 5 decode steps
        model(ids[:1])  # a plain forward checks its inputs: it reads
        assert forwards[-1] > 0
    with pytest.raises(ValueError, match="outside"):
        model(torch.tensor([[5, VOCAB]]))
