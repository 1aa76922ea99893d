"""from_pretrained with upstream's argument names: dtype / torch_dtype, device_map, config, config overrides,
low_cpu_mem_usage, trust_remote_code; unsupported upstream arguments refused; meta-device loading."""

import logging

import pytest
import torch
import transformers

from transformers_static import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers_static.modeling_utils import resolve_device_map

from .models.causal_lm_tester import perturb


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        dtype="float16",
    )
    path = str(tmp_path_factory.mktemp("llama"))
    perturb(transformers.LlamaForCausalLM(config), 0.1).to(torch.float16).save_pretrained(path)
    return path


IDS = torch.tensor([[3, 14, 15, 9, 26, 5]])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"dtype": "auto"},
        {"torch_dtype": torch.bfloat16},
        {"torch_dtype": "float32"},
        {"dtype": torch.float32, "torch_dtype": torch.bfloat16},
    ],
)
def test_dtype_arguments_as_upstream(checkpoint: str, kwargs: dict) -> None:
    ours = AutoModelForCausalLM.from_pretrained(checkpoint, **kwargs)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, **kwargs)
    assert ours.dtype == theirs.dtype
    assert all(p.dtype == ours.dtype for p in ours.parameters())


def test_logits_after_a_dtype_cast_equal_upstream(checkpoint: str) -> None:
    ours = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, theirs(IDS).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "device_map", ["cpu", "auto", {"": "cpu"}, {"model": "cpu", "lm_head": "cpu"}, torch.device("cpu")]
)
def test_device_map_on_one_device(checkpoint: str, device_map) -> None:
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map=device_map)
    expected = "cuda" if device_map == "auto" and torch.cuda.is_available() else "cpu"
    assert {p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()} == {expected}


@pytest.mark.parametrize(
    ("device_map", "expected"),
    [
        (None, "cpu"),
        ("cpu", "cpu"),
        ({"": "cpu"}, "cpu"),
        ({"model": "cpu", "lm_head": "cpu"}, "cpu"),
        (torch.device("cpu"), "cpu"),
        ("cuda", "cuda"),
        ("cuda:1", "cuda:1"),
        (0, "cuda:0"),
        (1, "cuda:1"),
        (torch.device("cuda", 1), "cuda:1"),
        ({"": "cuda:1"}, "cuda:1"),
        ({"model": "cuda:0", "lm_head": "cuda:0"}, "cuda:0"),
        ({"model": 1, "lm_head": "cuda:1"}, "cuda:1"),
    ],
)
def test_device_map_forms_name_their_device(device_map, expected: str) -> None:
    """Every form upstream accepts for one device, CUDA names included (resolving needs no GPU)."""
    assert resolve_device_map(device_map) == torch.device(expected)


@pytest.mark.parametrize("name", ["auto", "balanced", "sequential"])
def test_device_map_auto_takes_the_one_gpu_and_refuses_two(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device_map(name) == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=rf"device_map='{name}' would split the model over 2 GPUs"):
        resolve_device_map(name)


def test_device_map_that_splits_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match=r"would split the model over devices \['cpu', 'cuda:0'\]"):
        resolve_device_map({"model.layers.0": "cpu", "model.layers.1": "cuda:0"})
    with pytest.raises(ValueError, match="device_map must name one device"):
        resolve_device_map("not-a-device")
    assert resolve_device_map(1) == torch.device("cuda", 1)


def test_config_object_and_config_path(checkpoint: str, tmp_path) -> None:
    config = LlamaConfig.from_pretrained(checkpoint)
    config.rms_norm_eps = 1e-2
    by_object = AutoModelForCausalLM.from_pretrained(checkpoint, config=config, dtype=torch.float32)
    config.save_pretrained(tmp_path)
    by_path = LlamaForCausalLM.from_pretrained(checkpoint, config=str(tmp_path), dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, config=transformers.AutoConfig.from_pretrained(tmp_path), dtype=torch.float32
    )
    assert config.rms_norm_eps == 1e-2 and by_object.config is not config  # the caller's object is not kept
    with torch.no_grad():
        expected = theirs(IDS).logits
        torch.testing.assert_close(by_object(IDS).logits, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(by_path(IDS).logits, expected, atol=1e-4, rtol=0)


def test_config_field_overrides_as_upstream(checkpoint: str) -> None:
    ours = AutoModelForCausalLM.from_pretrained(checkpoint, rms_norm_eps=0.5, dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, rms_norm_eps=0.5, dtype=torch.float32)
    assert ours.config.rms_norm_eps == theirs.config.rms_norm_eps == 0.5
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, theirs(IDS).logits, atol=1e-4, rtol=0)


def test_unknown_keyword_is_a_type_error_as_upstream(checkpoint: str) -> None:
    with pytest.raises(TypeError):
        transformers.AutoModelForCausalLM.from_pretrained(checkpoint, not_an_argument=1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['not_an_argument'\]"):
        AutoModelForCausalLM.from_pretrained(checkpoint, not_an_argument=1)


@pytest.mark.parametrize("name", ["quantization_config", "max_memory", "offload_folder", "output_loading_info"])
def test_unsupported_upstream_arguments_are_refused(checkpoint: str, name: str) -> None:
    with pytest.raises(NotImplementedError, match=rf"from_pretrained\({name}=\.\.\.\) is not supported"):
        AutoModelForCausalLM.from_pretrained(checkpoint, **{name: object()})


def test_low_cpu_mem_usage_and_trust_remote_code(checkpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    """low_cpu_mem_usage is always on (meta-device loading): either value loads what the default load does, and
    what upstream loads given it."""
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)(IDS).logits
        for low in (True, False):
            ours = AutoModelForCausalLM.from_pretrained(checkpoint, low_cpu_mem_usage=low, dtype=torch.float32)
            theirs = transformers.AutoModelForCausalLM.from_pretrained(
                checkpoint, low_cpu_mem_usage=low, dtype=torch.float32
            )
            assert torch.equal(ours(IDS).logits, expected)
            torch.testing.assert_close(ours(IDS).logits, theirs(IDS).logits, atol=1e-4, rtol=0)
    with caplog.at_level(logging.WARNING, logger="transformers_static"):
        AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=True)
    assert "trust_remote_code=True is ignored: LlamaConfig is built into transformers-static" in caplog.text


def test_loading_initialises_no_real_weight(checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parameters are built on the meta device and take the checkpoint's tensors: nothing is drawn at random."""
    real_inits = []
    for name in ("normal_", "uniform_", "kaiming_uniform_", "zeros_"):
        init = getattr(torch.nn.init, name)

        def record(tensor, *args, _init=init, _name=name, **kwargs):
            if not tensor.is_meta:
                real_inits.append((_name, tuple(tensor.shape)))
            return _init(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.nn.init, name, record)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert real_inits == []
    assert not any(t.is_meta for t in model.state_dict().values())
