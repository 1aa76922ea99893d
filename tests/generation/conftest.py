"""Tiny random checkpoints (noise on every weight) shared by the generation tests: upstream's model and ours, loaded
from the same saved checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.generation import utils as generation_utils

from ..models.causal_lm_tester import perturb

VOCAB = 64


@dataclass
class Pair:
    path: str
    upstream: Any  # transformers' model
    ours: Any  # transformers_static's model, loaded from `path`


def save_noisy(upstream: Any, path: str) -> None:
    """Noise on every upstream weight (biases, norms, positions all matter), then a real checkpoint."""
    perturb(upstream, 0.1).eval().save_pretrained(path)


def candidate_stats(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The counts of the next candidate-decoding call (verify steps, drafts proposed and accepted), filled in when
    it returns."""
    stats: dict[str, int] = {}
    original = generation_utils.candidate_decode

    def spy(*args: Any, **kwargs: Any) -> Any:
        decoded = original(*args, **kwargs)
        stats.update(decoded.stats)
        return decoded

    monkeypatch.setattr(generation_utils, "candidate_decode", spy)
    return stats


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=2,
    )
    upstream = transformers.LlamaForCausalLM(config)
    path = str(tmp_path_factory.mktemp("llama"))
    save_noisy(upstream, path)
    return Pair(path, upstream, AutoModelForCausalLM.from_pretrained(path))


@pytest.fixture(scope="session")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """Window 5: the tests' prompts and new tokens cross it; small prefill chunks make the window layers rings."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=5,
        eos_token_id=2,
    )
    upstream = transformers.MistralForCausalLM(config)
    path = str(tmp_path_factory.mktemp("mistral"))
    save_noisy(upstream, path)
    return Pair(path, upstream, AutoModelForCausalLM.from_pretrained(path))
