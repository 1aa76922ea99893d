"""The ways a benchmark scenario generates: ours and upstream transformers, each eager and compiled, and on request
ours with the user's own compiled forward, ours compiled with max-autotune and ours with int8 / int4 weights.

Every runner is `run(input_ids, max_new_tokens, streamer) -> sequences`, greedy, with EOS disabled so every run
makes exactly `max_new_tokens` tokens. Ours compiled is `generate(..., compile=True)`; ours user-compiled is
`model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False)` then `generate(...)`; ours max-autotune
is `generate(..., compile="max-autotune")` on a model of its own (its weights are frozen into the graph); ours int8 is
`from_pretrained(..., quantization="int8")` then `generate(..., compile=True)`. Upstream compiled is its static
cache of a fixed `max_cache_len` with a `CompileConfig` (the way its documentation says), which on a device other
than CUDA/XPU only compiles when the config's `_compile_all_devices` flag is set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..models.auto import AutoModelForCausalLM

Runner = Callable[[torch.Tensor, int, Any], torch.Tensor]

OURS_EAGER, OURS_COMPILED = "ours-eager", "ours-compiled"
OURS_USER_COMPILED = "ours-user-compiled"
OURS_MAX_AUTOTUNE = "ours-max-autotune"
OURS_INT8_COMPILED, OURS_INT4_COMPILED = "ours-int8-compiled", "ours-int4-compiled"
OURS_QUANTIZED = {"int8": OURS_INT8_COMPILED, "int4": OURS_INT4_COMPILED}
UPSTREAM_EAGER, UPSTREAM_COMPILED = "upstream-eager", "upstream-compiled"
VARIANTS = (
    UPSTREAM_EAGER,
    UPSTREAM_COMPILED,
    OURS_EAGER,
    OURS_COMPILED,
    OURS_USER_COMPILED,
    OURS_MAX_AUTOTUNE,
    OURS_INT8_COMPILED,
    OURS_INT4_COMPILED,
)


@dataclass
class Variant:
    """A named runner; `note` says why it is unavailable (then `run` is None) or how it ran. `model` is ours when
    the variant runs a model of its own (its weight bytes set its decode floor)."""

    name: str
    run: Runner | None
    note: str = ""
    model: torch.nn.Module | None = None

    @property
    def compiled(self) -> bool:
        return self.name.endswith("compiled")


def upstream_version() -> str | None:
    """The installed upstream transformers version, or None when it is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def load_ours(
    path: Path, *, dtype: torch.dtype, device: torch.device, quantization: str | None = None
) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device, quantization=quantization)


def ours_variants(
    model: Any,
    *,
    compile: bool,
    user_compiled: bool = False,
    max_autotune: bool = False,
    quantization: str | None = None,
    load: Callable[..., torch.nn.Module] | None = None,
) -> list[Variant]:
    """Ours eager (`generate`) and compiled (`generate(..., compile=True)`), on the static path (the default); with
    `user_compiled`, `max_autotune` and `quantization` (which need `compile`), ours with its forward compiled by the
    user, ours with `compile="max-autotune"` and ours quantized, each a model of its own made by
    `load(quantization=...)`."""
    variants = [Variant(OURS_EAGER, _ours_runner(model, False), "static cache")]
    if not compile:
        return variants
    variants.append(Variant(OURS_COMPILED, _ours_runner(model, True), "static cache, generate(compile=True)"))
    if user_compiled:
        own = load(quantization=None)
        own.forward = torch.compile(own.forward, fullgraph=True, dynamic=False)
        note = "model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False)"
        variants.append(Variant(OURS_USER_COMPILED, _ours_runner(own, False), note, own))
    if max_autotune:
        frozen = load(quantization=None)
        note = 'generate(compile="max-autotune"): weights frozen into the graph, GEMM kernels autotuned'
        variants.append(Variant(OURS_MAX_AUTOTUNE, _ours_runner(frozen, "max-autotune"), note, frozen))
    if quantization is not None:
        quantized = load(quantization=quantization)
        note = f"from_pretrained(quantization={quantization!r}), generate(compile=True); tokens may differ"
        variants.append(Variant(OURS_QUANTIZED[quantization], _ours_runner(quantized, True), note, quantized))
    return variants


def _ours_runner(model: Any, compiled: bool | str) -> Runner:
    def run(input_ids: torch.Tensor, max_new_tokens: int, streamer: Any) -> torch.Tensor:
        return model.generate(
            input_ids, max_new_tokens=max_new_tokens, eos_token_id=None, streamer=streamer, compile=compiled
        )

    return run


def upstream_variants(
    path: Path, *, dtype: torch.dtype, device: torch.device, compile: bool, max_cache_len: int
) -> list[Variant]:
    """Upstream eager (its default dynamic cache) and compiled (static cache of `max_cache_len`), or one
    unavailable variant per name when upstream transformers is not installed."""
    names = [UPSTREAM_EAGER, UPSTREAM_COMPILED] if compile else [UPSTREAM_EAGER]
    if upstream_version() is None:
        return [Variant(name, None, "upstream transformers is not installed") for name in names]
    model = _load_upstream(path, dtype=dtype, device=device)
    variants = [Variant(UPSTREAM_EAGER, _upstream_runner(model, {}), "dynamic cache")]
    if compile:
        compile_config, note = _upstream_compile_config(device)
        options = {"cache_implementation": "static", "max_cache_len": max_cache_len, "compile_config": compile_config}
        variants.append(Variant(UPSTREAM_COMPILED, _upstream_runner(model, options), note))
    return variants


def _load_upstream(path: Path, *, dtype: torch.dtype, device: torch.device) -> Any:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None  # every run makes exactly max_new_tokens tokens
    model.generation_config.pad_token_id = 0
    return model


def _upstream_compile_config(device: torch.device) -> tuple[Any, str]:
    from transformers import CompileConfig

    compile_config = CompileConfig()
    note = f"static cache, CompileConfig(mode={compile_config.mode!r})"
    if device.type not in ("cuda", "xpu"):
        compile_config._compile_all_devices = True  # upstream skips compiling on CPU without this flag
        note += ", _compile_all_devices=True"
    return compile_config, note


def _upstream_runner(model: Any, options: dict[str, Any]) -> Runner:
    def run(input_ids: torch.Tensor, max_new_tokens: int, streamer: Any) -> torch.Tensor:
        return model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            streamer=streamer,
            **options,
        )

    return run
