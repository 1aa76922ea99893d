"""GGUF rope scaling read as llama.cpp reads it: `rope.scaling.type` defaults to linear, the factor is
`rope.scaling.factor` or the older `rope.scale_linear`, type none never scales, YaRN is read (tests/test_gguf.py), other types are refused. Upstream
transformers ignores these keys, so the reference is our own model loaded from safetensors with the linear scaling
stated in its config."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_gguf_pytorch_utils import load_gguf_config_dict

from .gguf_testing_utils import byte_tokens, gguf, gguf_tensors, llama_metadata, logits, write_gguf
from .models.causal_lm_tester import perturb

VOCAB = 99
FACTOR = 4.0
LLAMA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture
def linear_checkpoint(tmp_path) -> tuple[str, Any]:
    """A noisy tiny Llama with linear rope scaling (factor 4) saved as safetensors; its directory and config."""
    torch.manual_seed(0)
    rope = {"rope_type": "linear", "factor": FACTOR, "rope_theta": 500.0}
    config = transformers.LlamaConfig(vocab_size=VOCAB, rope_parameters=rope, **LLAMA)
    model = perturb(transformers.LlamaForCausalLM(config).eval(), 0.1)
    model.save_pretrained(tmp_path / "hf")
    return str(tmp_path / "hf"), model.config


def _write(tmp_path, checkpoint: str, config: Any, scaling: dict[str, Any]) -> str:
    path = str(tmp_path / "model.gguf")
    tensors = gguf_tensors("llama", checkpoint, config)
    write_gguf(path, "llama", tensors, {**llama_metadata(config), **scaling}, tokenizer=byte_tokens(VOCAB))
    return path


@pytest.fixture
def old_key_writer(monkeypatch) -> None:
    """`rope.scale_linear`, the key older llama.cpp converters wrote (the gguf package no longer has a method)."""
    monkeypatch.setattr(
        gguf.GGUFWriter,
        "add_rope_scale_linear",
        lambda writer, value: writer.add_float32(f"{writer.arch}.rope.scale_linear", value),
        raising=False,
    )


@pytest.mark.parametrize("key", ["add_rope_scaling_factor", "add_rope_scale_linear"])
def test_factor_without_type_is_linear_scaling(key, linear_checkpoint, old_key_writer, tmp_path) -> None:
    checkpoint, config = linear_checkpoint
    path = _write(tmp_path, checkpoint, config, {key: FACTOR})
    assert load_gguf_config_dict(path)["rope_parameters"]["rope_type"] == "linear"
    ours = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf")
    reference = AutoModelForCausalLM.from_pretrained(checkpoint)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(ours, ids), logits(reference, ids), atol=1e-5, rtol=0)


def test_type_none_never_scales(linear_checkpoint, tmp_path) -> None:
    checkpoint, config = linear_checkpoint
    scaling = {"add_rope_scaling_type": gguf.RopeScalingType.NONE, "add_rope_scaling_factor": FACTOR}
    path = _write(tmp_path, checkpoint, config, scaling)
    assert load_gguf_config_dict(path)["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}


def test_other_scaling_types_are_refused(linear_checkpoint, tmp_path) -> None:
    checkpoint, config = linear_checkpoint
    scaling = {"add_rope_scaling_type": gguf.RopeScalingType.LONGROPE, "add_rope_scaling_factor": FACTOR}
    path = _write(tmp_path, checkpoint, config, scaling)
    with pytest.raises(
        ValueError, match=r"rope scaling 'longrope' is not supported \(supported: none, linear, yarn\)"
    ):
        load_gguf_config_dict(path)
