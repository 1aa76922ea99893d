"""`pipeline(...)` arguments upstream accepts: `device_map` places the pipeline on the map's device (CUDA faked where
there is none), and a `generation_config` given as upstream's class or a dict works as in `generate`."""

import logging

import pytest
import torch
import transformers

import transformers_static

from . import tokenizer_fixtures as fixtures


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return fixtures.tiny_llama_checkpoint(str(tmp_path_factory.mktemp("ckpt")))


@pytest.fixture
def fake_cuda(monkeypatch) -> list:
    """CUDA reported available (two GPUs); `model.to(...)` records its arguments and moves nothing."""
    moved = []

    def record(model, *args, **kwargs):
        moved.append(args or kwargs)
        return model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(transformers_static.LlamaForCausalLM, "to", record)
    return moved


@pytest.mark.parametrize(
    "arguments",
    [{"device_map": "cpu"}, {"device_map": {"": "cpu"}}, {"model_kwargs": {"device_map": "cpu"}}],
    ids=["string", "dict", "model_kwargs"],
)
def test_device_map_places_the_pipeline_on_its_device(arguments, checkpoint, fake_cuda) -> None:
    pipe = transformers_static.pipeline("text-generation", model=checkpoint, **arguments)
    assert pipe.device == torch.device("cpu")
    assert pipe.model.device == torch.device("cpu")
    assert not [args for args in fake_cuda if "cuda" in str(args)]


def test_device_map_of_another_gpu_moves_a_loaded_model_there(checkpoint, fake_cuda) -> None:
    model = transformers_static.AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = transformers_static.AutoTokenizer.from_pretrained(checkpoint)
    fake_cuda.clear()
    pipe = transformers_static.pipeline("text-generation", model=model, tokenizer=tokenizer, device_map="cuda:1")
    assert pipe.device == torch.device("cuda:1")
    assert fake_cuda == [(torch.device("cuda:1"),)]


def test_device_overrides_device_map_with_upstreams_warning(checkpoint, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        pipe = transformers_static.pipeline("text-generation", model=checkpoint, device="cpu", device_map="cpu")
    assert pipe.device == torch.device("cpu")
    assert "Both `device` and `device_map` are specified. `device` will override `device_map`" in caplog.text


def test_device_map_twice_is_refused(checkpoint) -> None:
    with pytest.raises(ValueError, match=r"cannot use both `pipeline\(... device_map=..., model_kwargs="):
        transformers_static.pipeline(
            "text-generation", model=checkpoint, device_map="cpu", model_kwargs={"device_map": "cpu"}
        )


def _generate_kwargs(pipe, **call_kwargs) -> dict:
    """What the pipeline passes `generate`, its generation config as the dict of the fields it sets."""
    calls = []

    def fake_generate(input_ids, attention_mask=None, **kwargs):
        calls.append(kwargs)
        return torch.cat([input_ids, input_ids[:, :1]], dim=1)

    pipe.model.generate = fake_generate
    pipe("Hello", **call_kwargs)
    config = calls[0].pop("generation_config")
    set_fields = config.to_diff_dict() if isinstance(config, transformers.GenerationConfig) else config.to_dict()
    return {**calls[0], "generation_config": {k: v for k, v in set_fields.items() if k != "transformers_version"}}


@pytest.mark.parametrize("form", ["upstream", "dict"])
@pytest.mark.parametrize("where", ["init", "call"])
def test_generation_config_as_upstreams_class_or_a_dict(form, where, checkpoint) -> None:
    """The same generate kwargs (the pipeline's defaults added to a copy of the config) and text as upstream's
    pipeline given upstream's GenerationConfig (upstream's pipeline fails on a dict; `generate` takes one)."""
    values = {"max_new_tokens": 3}
    config = transformers.GenerationConfig(**values) if form == "upstream" else dict(values)

    def run(library, generation_config, **call_kwargs):
        init = {"generation_config": generation_config} if where == "init" else {}
        call = {"generation_config": generation_config} if where == "call" else {}
        pipe = library.pipeline("text-generation", model=checkpoint, device="cpu", **init)
        return pipe, {**call, **call_kwargs}

    pipe, call = run(transformers, transformers.GenerationConfig(**values))
    expected = _generate_kwargs(pipe, **call)
    assert expected["generation_config"]["do_sample"] is True  # the pipeline's defaults went into the config
    pipe, call = run(transformers_static, config)
    assert _generate_kwargs(pipe, **call) == expected
    assert config == (transformers.GenerationConfig(**values) if form == "upstream" else values)  # not changed

    pipe, call = run(transformers, transformers.GenerationConfig(**values), do_sample=False)
    expected_text = pipe("Hello", **call)
    pipe, call = run(transformers_static, config, do_sample=False)
    assert pipe("Hello", **call) == expected_text


def test_assistant_model_drafts_for_the_pipeline(checkpoint, monkeypatch) -> None:
    """upstream's `pipeline(..., assistant_model=model)`: assisted greedy decoding makes the pipeline's own text."""
    from .generation.conftest import candidate_stats

    pipe = transformers_static.pipeline("text-generation", model=checkpoint)
    draft = transformers_static.AutoModelForCausalLM.from_pretrained(checkpoint)
    plain = pipe("Hello there", max_new_tokens=12, do_sample=False)
    stats = candidate_stats(monkeypatch)
    assisted = pipe("Hello there", max_new_tokens=12, do_sample=False, assistant_model=draft)
    assert assisted == plain and len(plain[0]["generated_text"]) > len("Hello there")
    assert stats["drafted"] > 0
