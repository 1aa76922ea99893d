"""The benchmark driver behind `transformers-static bench`: ours vs upstream transformers, eager and compiled, in one process on one checkpoint.

For each scenario (model x batch x prompt length) every variant makes `new_tokens` greedy tokens:

1. a first call (compile included, on an empty compile cache of its own: inductor's on-disk caches would
   otherwise make it depend on earlier runs) at the scenario's prompt length, then a call at another prompt
   length (to count what a new prompt length compiles);
2. `repeats` timed runs, interleaved across variants so that machine noise hits them alike.

A streamer timestamps each token: prefill ms is the time to the first new token, ms/token the mean gap between
the following ones (median over runs, with min and max). Also recorded: graphs compiled, peak memory, whether
the tokens equal the reference's (upstream eager, else ours eager), and the decode floor (decode weight bytes /
measured memory bandwidth).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._inductor.utils import fresh_cache

from ..configuration_utils import PretrainedConfig
from ..generation import GenerationConfig
from ..models.auto import AutoConfig
from . import llama_cpp, report
from .measure import (
    PeakMemory,
    TimingStreamer,
    decode_weight_bytes,
    graphs_compiled,
    load_average,
    memory_bandwidth_gbps,
)
from .presets import checkpoint_path, gguf_source, model_label
from .progress import Progress
from .runners import (
    OURS_EAGER,
    OURS_QUANTIZED,
    UPSTREAM_COMPILED,
    UPSTREAM_EAGER,
    VARIANTS,
    Variant,
    load_ours,
    ours_variants,
    upstream_variants,
    upstream_version,
)

NEW_PROMPT_LEN_OFFSET = 5  # the second call's prompt is this much longer


@dataclass
class BenchOptions:
    models: list[str]  # preset names, checkpoint directories or GGUF files
    batches: list[int] = field(default_factory=lambda: [1])
    prompt_lens: list[int] = field(default_factory=lambda: [16])
    new_tokens: int = 64
    repeats: int = 5
    compile: bool = True
    upstream: bool = True
    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    out: Path = Path("bench_results")
    seed: int = 0
    user_compiled: bool = False  # add ours with the user's own torch.compile(model.forward)
    max_autotune: bool = False  # add ours with generate(compile="max-autotune")
    quantization: str | None = None  # add ours quantized ("int8" or "int4"), compiled
    llama_cpp: Path | None = None  # a llama.cpp build's binaries: its figures on this host (bench/llama_cpp.py)


@dataclass
class VariantResult:
    """Everything measured for one variant in one scenario."""

    variant: str
    available: bool
    note: str = ""
    first_call_s: float | None = None
    prefill_ms: float | None = None
    ms_per_token: dict[str, float] | None = None  # median, min, max over the timed runs
    runs_ms_per_token: list[float] = field(default_factory=list)
    graphs_compiled: int | None = None
    graphs_first_call: int | None = None
    graphs_new_prompt_len: int | None = None
    peak_memory_mb: float | None = None  # the process's peak (RSS on CPU), all models included
    peak_memory_increase_mb: float | None = None  # the most one generate call added over its start
    tokens_match_reference: bool | None = None
    x_floor: float | None = None
    vs_upstream_compiled: float | None = None
    vs_llama_cpp: float | None = None  # where llama.cpp's figure for this model and weight type is known
    # Filled while running, not reported.
    _sequences: torch.Tensor | None = None
    _prefill: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


def run_benchmark(options: BenchOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run every scenario, write results.json and the plot into `options.out`, and return the results."""
    bandwidth = memory_bandwidth_gbps(options.device)
    results = _header(options, bandwidth)
    if options.compile:
        _warm_up_compiler(options.device)
    bar = progress or Progress()
    for model in options.models:
        path = checkpoint_path(model)
        config = AutoConfig.from_pretrained(path)
        for batch in options.batches:
            for prompt_len in options.prompt_lens:
                scenario = Scenario(model_label(model), path, config, batch, prompt_len, gguf_source(model))
                results["scenarios"].append(run_scenario(scenario, options, bandwidth, bar))
    results["machine"]["load_average_at_end"] = load_average()
    options.out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, options.out / "results.json")
    results["plot"] = report.write_plot(results, options.out / "bench.png")
    return results


def _warm_up_compiler(device: torch.device) -> None:
    """Pay the compiler's once-per-process costs (imports, toolchain checks, worker pool) on a toy function, so
    that no variant's first call carries them for the others."""
    torch.compile(lambda x: torch.relu(x) * 2, fullgraph=True)(torch.randn(8, device=device))
    torch._dynamo.reset()


def total_steps(options: BenchOptions) -> int:
    """Progress-bar length: every generate call of the run."""
    variants = 2 * (1 + options.compile) if options.upstream else 1 + options.compile
    if options.compile:
        variants += options.user_compiled + options.max_autotune + (options.quantization is not None)
    scenarios = len(options.models) * len(options.batches) * len(options.prompt_lens)
    return scenarios * variants * (2 + options.repeats)


@dataclass
class Scenario:
    model: str  # a preset's name, else the checkpoint's folder or file name
    path: Path
    config: PretrainedConfig
    batch: int
    prompt_len: int
    gguf: Path | None = None  # the GGUF the checkpoint comes from (what llama.cpp runs)

    @property
    def label(self) -> str:
        return f"{self.model} b{self.batch} p{self.prompt_len}"


def run_scenario(scenario: Scenario, options: BenchOptions, bandwidth: float, bar: Progress) -> dict[str, Any]:
    torch._dynamo.reset()  # every scenario compiles from scratch: its first call includes compilation
    ours = load_ours(scenario.path, dtype=options.dtype, device=options.device)
    weight_bytes = decode_weight_bytes(ours)
    variants = _variants(ours, scenario, options)
    results = {v.name: VariantResult(v.name, v.run is not None, v.note) for v in variants}
    prompts = _prompts(scenario, options)
    for variant in variants:
        bar.set_description(f"{scenario.label} {variant.name}: first calls")
        if variant.run is not None:
            _first_calls(variant, results[variant.name], prompts, options)
        bar.update(2)
    for repeat in range(options.repeats):
        for variant in variants:
            if results[variant.name].available:
                bar.set_description(f"{scenario.label} {variant.name}: run {repeat + 1}/{options.repeats}")
                _timed_run(variant, results[variant.name], prompts[0], options)
            bar.update(1)
    floor_ms = weight_bytes / (bandwidth * 1e9) * 1e3
    floors = {v.name: decode_weight_bytes(v.model) / (bandwidth * 1e9) * 1e3 for v in variants if v.model is not None}
    reference = _summarise(results, floor_ms, floors)
    llama_cpp_figures = _compare_with_llama_cpp(results, scenario, options)
    return {
        "llama_cpp_ms_per_token": llama_cpp_figures,
        "label": scenario.label,
        "model": scenario.model,
        "model_type": scenario.config.model_type,
        "batch": scenario.batch,
        "prompt_len": scenario.prompt_len,
        "new_tokens": options.new_tokens,
        "decode_weight_bytes": weight_bytes,
        "floor_ms_per_token": floor_ms,
        "reference": reference,
        "results": [results[name].to_dict() for name in VARIANTS if name in results],
    }


def _variants(ours: torch.nn.Module, scenario: Scenario, options: BenchOptions) -> list[Variant]:
    def load(quantization: str | None) -> torch.nn.Module:
        return load_ours(scenario.path, dtype=options.dtype, device=options.device, quantization=quantization)

    variants = ours_variants(
        ours,
        compile=options.compile,
        user_compiled=options.user_compiled,
        max_autotune=options.max_autotune,
        quantization=options.quantization,
        load=load,
    )
    if options.upstream:
        longest = scenario.prompt_len + NEW_PROMPT_LEN_OFFSET
        variants += upstream_variants(
            scenario.path,
            dtype=options.dtype,
            device=options.device,
            compile=options.compile,
            max_cache_len=GenerationConfig().static_cache_len(longest, options.new_tokens),  # what ours allocates
        )
    return sorted(variants, key=lambda v: VARIANTS.index(v.name))


def _prompts(scenario: Scenario, options: BenchOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """The scenario's prompt `[batch, prompt_len]` and a longer one for the new-prompt-length call."""
    generator = torch.Generator().manual_seed(options.seed)
    vocab = scenario.config.vocab_size
    shape = (scenario.batch, scenario.prompt_len + NEW_PROMPT_LEN_OFFSET)
    longest = torch.randint(min(3, vocab - 1), vocab, shape, generator=generator).to(options.device)
    return longest[:, : scenario.prompt_len].contiguous(), longest


def _first_calls(
    variant: Variant, result: VariantResult, prompts: tuple[torch.Tensor, torch.Tensor], options: BenchOptions
) -> None:
    """The first call (timed, compile included on a cold compile cache of its own; its tokens are compared) and one
    at a new prompt length."""
    try:
        with cold_compile_cache(variant.compiled):
            _first_and_new_prompt_len(variant, result, prompts, options)
    except Exception as err:  # a variant that cannot run here is reported, not fatal
        result.available = False
        result.note = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


def cold_compile_cache(compiled: bool) -> AbstractContextManager:
    """Where a compiled variant's first calls run: an empty compile cache of their own (inductor's on-disk caches
    would otherwise make the first call depend on earlier runs); nothing for an eager variant."""
    return fresh_cache() if compiled else nullcontext()


def _first_and_new_prompt_len(
    variant: Variant, result: VariantResult, prompts: tuple[torch.Tensor, torch.Tensor], options: BenchOptions
) -> None:
    start = time.perf_counter()
    result._sequences, result.graphs_first_call = _generate(variant, result, prompts[0], options)
    result.first_call_s = time.perf_counter() - start
    _, result.graphs_new_prompt_len = _generate(variant, result, prompts[1], options)


def _timed_run(variant: Variant, result: VariantResult, prompt: torch.Tensor, options: BenchOptions) -> None:
    streamer = TimingStreamer()
    _generate(variant, result, prompt, options, streamer)
    result.runs_ms_per_token.append(streamer.decode_ms_per_token())
    result._prefill.append(streamer.prefill_ms())


def _generate(
    variant: Variant,
    result: VariantResult,
    prompt: torch.Tensor,
    options: BenchOptions,
    streamer: TimingStreamer | None = None,
) -> tuple[torch.Tensor, int]:
    """One generate call, tracking peak memory and graphs compiled; returns (sequences on CPU, graphs)."""
    tracker = PeakMemory(options.device)
    graphs = graphs_compiled()
    with tracker.track():
        sequences = variant.run(prompt, options.new_tokens, streamer or TimingStreamer())
    graphs = graphs_compiled() - graphs
    result.graphs_compiled = (result.graphs_compiled or 0) + graphs
    result.peak_memory_mb = max(result.peak_memory_mb or 0.0, tracker.peak_mb)
    increase = max(tracker.peak_mb - tracker.start_mb, 0.0)
    result.peak_memory_increase_mb = max(result.peak_memory_increase_mb or 0.0, increase)
    return sequences.cpu(), graphs


def _summarise(results: dict[str, VariantResult], floor_ms: float, floors: dict[str, float]) -> str:
    """Medians, token equality against the reference (returned: upstream eager, else ours eager), and
    multiples of the floor (a variant's own where it has its own weights) and of upstream compiled."""
    name = UPSTREAM_EAGER if results.get(UPSTREAM_EAGER) and results[UPSTREAM_EAGER].available else OURS_EAGER
    reference = results[name]
    for result in results.values():
        if not result.available:
            continue
        runs = result.runs_ms_per_token
        result.ms_per_token = {"median": statistics.median(runs), "min": min(runs), "max": max(runs)}
        result.prefill_ms = statistics.median(result._prefill)
        if reference.available:
            result.tokens_match_reference = bool(torch.equal(result._sequences, reference._sequences))
        result.x_floor = result.ms_per_token["median"] / floors.get(result.variant, floor_ms)
        if result.variant.endswith("compiled") and not result.graphs_compiled:
            result.note += "; nothing was compiled: it ran eager"
    upstream = results.get(UPSTREAM_COMPILED)
    if upstream is not None and upstream.available:
        for ours in results.values():
            if ours.variant.startswith("ours") and ours.available:
                ours.vs_upstream_compiled = ours.ms_per_token["median"] / upstream.ms_per_token["median"]
    return name


def _compare_with_llama_cpp(
    results: dict[str, VariantResult], scenario: Scenario, options: BenchOptions
) -> dict[str, float]:
    """With `--llama-cpp`, llama.cpp's decode ms/token on this host for the weight types of the run's variants (one
    sequence: llama-bench decodes one), and each variant's ms/token as a multiple of its type's."""
    if options.llama_cpp is None or scenario.gguf is None or scenario.batch != 1:
        return {}
    quantized = {name: method for method, name in OURS_QUANTIZED.items()}
    weights = {
        name: quantized.get(name, str(options.dtype).removeprefix("torch."))
        for name, result in results.items()
        if result.available and name.startswith("ours")
    }
    figures = llama_cpp.decode_ms_per_token(
        options.llama_cpp,
        scenario.gguf,
        sorted(set(weights.values()) & set(llama_cpp.LLAMA_CPP_TYPES)),
        prompt_len=scenario.prompt_len,
        new_tokens=options.new_tokens,
        repeats=options.repeats,
        threads=torch.get_num_threads(),
        workdir=options.out / "llama_cpp",
    )
    for name, weight in weights.items():
        if weight in figures:
            results[name].vs_llama_cpp = results[name].ms_per_token["median"] / figures[weight]
    return figures


def _header(options: BenchOptions, bandwidth: float) -> dict[str, Any]:
    return {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "device": str(options.device),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average_at_start": load_average(),
            "memory_bandwidth_gbps": bandwidth,
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": upstream_version(),
            "transformers_static": _version(),
        },
        "options": {
            "models": options.models,
            "batches": options.batches,
            "prompt_lens": options.prompt_lens,
            "new_tokens": options.new_tokens,
            "repeats": options.repeats,
            "compile": options.compile,
            "upstream": options.upstream,
            "dtype": str(options.dtype).removeprefix("torch."),
            "user_compiled": options.user_compiled,
            "max_autotune": options.max_autotune,
            "quantization": options.quantization,
        },
        "scenarios": [],
    }


def _version() -> str:
    from .. import __version__

    return __version__
