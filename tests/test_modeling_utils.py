"""Configs and checkpoints: what loads, what is refused, and the errors raised before any state changes."""

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from transformers_static import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    StaticCache,
)

from .models.causal_lm_tester import perturb

TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("llama"))
    upstream = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=64, **TINY))
    perturb(upstream, 0.1).save_pretrained(path)
    return path


def copy_checkpoint(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def test_upstream_config_json_round_trips(checkpoint: str, tmp_path) -> None:
    config = AutoConfig.from_pretrained(checkpoint)
    assert isinstance(config, LlamaConfig)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    config.save_pretrained(tmp_path)
    upstream = transformers.LlamaConfig.from_pretrained(tmp_path)
    assert upstream.num_key_value_heads == 2 and upstream.rope_parameters["rope_theta"] == 10000.0


def test_older_config_fields_are_accepted() -> None:
    config = LlamaConfig(
        rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0}, torch_dtype="bfloat16", **TINY
    )
    assert config.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}
    assert config.dtype == torch.bfloat16
    assert config.to_dict()["dtype"] == "bfloat16"


def test_unsupported_rope_type_is_refused() -> None:
    with pytest.raises(ValueError, match="rope_type 'dynamic' is not supported"):
        LlamaConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0}, **TINY)


def test_unknown_model_type_lists_supported(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(
        ValueError,
        match="Unknown model_type .bert.; supported model types: (.*, )?apertus, arcee, .*bloom, .*falcon, .*gemma, .*llama, "
        ".*mistral",
    ):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_missing_directory_and_config(tmp_path) -> None:
    with pytest.raises(OSError, match="is not a directory"):
        LlamaForCausalLM.from_pretrained(tmp_path / "nope")
    with pytest.raises(OSError, match=r"No config.json found"):
        AutoConfig.from_pretrained(tmp_path)


def test_missing_weight_is_an_error(checkpoint: str, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    path = copy_checkpoint(checkpoint, str(tmp_path / "ckpt"))
    weights = load_file(os.path.join(path, "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing 1 weight\(s\).*model.layers.1.mlp.up_proj.weight"):
        LlamaForCausalLM.from_pretrained(path)


def test_unexpected_weights_are_named_in_a_warning_and_skipped(
    checkpoint: str, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    from safetensors.torch import load_file, save_file

    path = copy_checkpoint(checkpoint, str(tmp_path / "ckpt"))
    weights = load_file(os.path.join(path, "model.safetensors"))
    weights["model.layers.0.mlp.extra_proj.weight"] = torch.ones(3, 2)
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        ours = LlamaForCausalLM.from_pretrained(path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("unexpected" in m.lower() and "model.layers.0.mlp.extra_proj.weight" in m for m in warnings), warnings
    upstream = transformers.LlamaForCausalLM.from_pretrained(path).eval()  # upstream skips it too
    ids = torch.arange(7)[None]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, upstream(ids).logits, atol=1e-5, rtol=0)


def test_auto_from_pretrained_takes_a_config_as_upstream(checkpoint: str) -> None:
    """A config given to the Auto class replaces the checkpoint's (here another rope_theta), as upstream's does."""
    ours_config, theirs_config = (
        AutoConfig.from_pretrained(checkpoint),
        transformers.AutoConfig.from_pretrained(checkpoint),
    )
    for config in (ours_config, theirs_config):
        config.rope_parameters["rope_theta"] = 50.0
    ours = AutoModelForCausalLM.from_pretrained(checkpoint, config=ours_config)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, config=theirs_config).eval()
    default = AutoModelForCausalLM.from_pretrained(checkpoint)
    ids = torch.arange(7)[None]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-5, rtol=0)
        assert (ours(ids).logits - default(ids).logits).abs().max() > 1e-2


def test_shape_mismatch_is_an_error(checkpoint: str, tmp_path) -> None:
    path = copy_checkpoint(checkpoint, str(tmp_path / "ckpt"))
    config_file = Path(path) / "config.json"
    config = json.loads(config_file.read_text())
    config["intermediate_size"] = 40
    config_file.write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"has shape \[48, 32\] in the checkpoint, LlamaForCausalLM expects \[40, 32\]"
    ):
        LlamaForCausalLM.from_pretrained(path)


def test_corrupt_safetensors_is_an_error(checkpoint: str, tmp_path) -> None:
    path = copy_checkpoint(checkpoint, str(tmp_path / "ckpt"))
    weights = Path(path) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(OSError, match="corrupt or truncated"):
        LlamaForCausalLM.from_pretrained(path)


def test_no_weights_is_an_error(checkpoint: str, tmp_path) -> None:
    path = copy_checkpoint(checkpoint, str(tmp_path / "ckpt"))
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(OSError, match="No weights found"):
        LlamaForCausalLM.from_pretrained(path)


def test_bin_checkpoint_loads_with_weights_only_and_refuses_code(checkpoint: str, tmp_path) -> None:
    reference = LlamaForCausalLM.from_pretrained(checkpoint)
    path = copy_checkpoint(checkpoint, str(tmp_path / "ckpt"))
    os.remove(os.path.join(path, "model.safetensors"))
    torch.save(reference.state_dict(), os.path.join(path, "pytorch_model.bin"))
    loaded = LlamaForCausalLM.from_pretrained(path)
    ids = torch.arange(6)[None]
    torch.testing.assert_close(loaded(ids).logits, reference(ids).logits, atol=0, rtol=0)

    torch.save({"evil": shutil.rmtree}, os.path.join(path, "pytorch_model.bin"))  # a pickled callable
    with pytest.raises(OSError, match="weights_only=True"):
        LlamaForCausalLM.from_pretrained(path)


def test_upstream_sharded_checkpoint_loads(checkpoint: str, tmp_path) -> None:
    upstream = transformers.LlamaForCausalLM.from_pretrained(checkpoint).eval()
    upstream.save_pretrained(tmp_path, max_shard_size="20KB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    ours = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.arange(7)[None]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, upstream(ids).logits, atol=1e-5, rtol=0)


def test_base_model_loads_from_a_head_checkpoint(checkpoint: str) -> None:
    base = AutoModel.from_pretrained(checkpoint)
    head = LlamaForCausalLM.from_pretrained(checkpoint)
    assert isinstance(base, LlamaModel)
    ids = torch.arange(5)[None]
    torch.testing.assert_close(base(ids).last_hidden_state, head.model(ids).last_hidden_state, atol=0, rtol=0)


def test_half_precision_load_keeps_rope_in_float32(checkpoint: str) -> None:
    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.isfinite(model(torch.arange(5)[None], attention_mask=torch.tensor([[0, 0, 1, 1, 1]])).logits).all()


def test_loss_matches_upstream(checkpoint: str) -> None:
    upstream = transformers.LlamaForCausalLM.from_pretrained(checkpoint).eval()
    ours = LlamaForCausalLM.from_pretrained(checkpoint)
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :2] = -100
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, labels=labels).loss, upstream(ids, labels=labels).loss, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"attention_mask": torch.ones(1, 1, 2, 7, dtype=torch.bool)},
            r"4D attention_mask must have shape \[1, 1, 2, 8\]",
        ),
        ({"cache_position": torch.tensor([7, 8])}, "cache_position reaches 8, past the StaticCache's max_cache_len 8"),
        ({"cache_position": torch.tensor([1])}, r"cache_position must have shape \[2\]"),
    ],
)
def test_bad_forward_input_raises_before_any_cache_write(checkpoint: str, kwargs: dict, message: str) -> None:
    model = LlamaForCausalLM.from_pretrained(checkpoint)
    cache = StaticCache(model.config, max_batch_size=1, max_cache_len=8)
    call = {"cache_position": torch.tensor([0, 1]), **kwargs}
    with pytest.raises(ValueError, match=message):
        model(torch.tensor([[5, 6]]), past_key_values=cache, **call)
    assert all(k.abs().sum() == 0 for k in cache.key_cache), "nothing may be written before the error"


def test_batch_larger_than_cache_raises(checkpoint: str) -> None:
    model = LlamaForCausalLM.from_pretrained(checkpoint)
    cache = StaticCache(model.config, max_batch_size=1, max_cache_len=8)
    with pytest.raises(ValueError, match="batch size 2 is larger than the StaticCache's max_batch_size 1"):
        model(torch.ones(2, 2, dtype=torch.long), past_key_values=cache, cache_position=torch.arange(2))


def test_unknown_attn_implementation(checkpoint: str) -> None:
    with pytest.raises(ValueError, match=r"Unknown attn_implementation 'flash'; expected one of \['eager', 'sdpa'\]"):
        LlamaForCausalLM.from_pretrained(checkpoint, attn_implementation="flash")
