"""`transformers-static bench`: ours vs upstream transformers, eager and compiled, on the same weights.

transformers-static bench [MODEL_DIR | FILE.gguf | --arch ARCH | --preset NAME[,NAME]] [--batch 1,4] [--prompt-len 16,128]
                          [--new-tokens N] [--repeats N] [--out DIR] [--no-compile] [--no-upstream]
                          [--user-compiled] [--max-autotune] [--quantization int8|int4] [--llama-cpp DIR] [--tp N]
transformers-static bench --prompt-lookup K [MODEL_DIR | --preset NAME] [--new-tokens N] [--repeats N] [--no-compile]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..bench.presets import DEFAULT_PRESET_FOR_ARCH, get_preset
from .args import (
    PROG,
    UsageError,
    add_device_args,
    add_quantization_arg,
    int_list,
    model_dir_path,
    name_list,
    parse_device,
    positive_int,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="ours vs upstream transformers, eager and compiled, on the same weights",
        description="Benchmark generation, in one process on one checkpoint: ours eager and compiled, upstream "
        "transformers eager and compiled (its static cache). Prints a table, writes results.json and bench.png.",
    )
    parser.add_argument("model_dir", nargs="?", metavar="MODEL_DIR", help="checkpoint directory or GGUF file")
    parser.add_argument("--arch", choices=sorted(DEFAULT_PRESET_FOR_ARCH), help="run this architecture's tiny preset")
    parser.add_argument("--preset", type=name_list, metavar="NAME[,NAME]", help="presets to run (default: llama-tiny)")
    parser.add_argument("--batch", type=int_list, default=[1], metavar="1,4", help="batch sizes (default 1)")
    parser.add_argument("--prompt-len", type=int_list, default=[16], metavar="16,128", help="prompt lengths")
    parser.add_argument("--new-tokens", type=positive_int, default=64, metavar="N", help="tokens per run (64)")
    parser.add_argument("--repeats", type=positive_int, default=5, metavar="N", help="timed runs per variant (5)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where results.json and bench.png go (default: <cache>/bench)",
    )
    parser.add_argument("--no-compile", action="store_true", help="eager variants only (fast)")
    parser.add_argument("--no-upstream", action="store_true", help="ours only, even if transformers is installed")
    parser.add_argument(
        "--llama-cpp",
        type=Path,
        default=None,
        metavar="DIR",
        help="a llama.cpp build's binaries (llama-bench, llama-quantize): its decode ms/token on this host, same "
        "weights requantized per weight type, in a 'vs llama.cpp' column (GGUF models, batch 1)",
    )
    parser.add_argument(
        "--user-compiled",
        action="store_true",
        help="add ours with the user's own torch.compile(model.forward, fullgraph=True, dynamic=False)",
    )
    parser.add_argument(
        "--max-autotune",
        action="store_true",
        help='add ours with generate(compile="max-autotune"): weights frozen into the graph, GEMM kernels autotuned '
        "(a first call of minutes)",
    )
    add_quantization_arg(parser, "add ours with int8 or int4 weight-only linear layers, generate(compile=True)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument(
        "--tp",
        type=positive_int,
        metavar="N",
        help="instead: ours in one process next to tensor parallel over N ranks (torchrun subprocesses)",
    )
    parser.add_argument(
        "--prompt-lookup",
        type=positive_int,
        metavar="K",
        help="instead: plain compiled decoding vs prompt lookup with K drafts per verify step, on a task whose "
        "answer copies its prompt (repeating a passage) (default model: the smollm2-135m preset)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    add_device_args(parser, default_dtype="float32")
    parser.set_defaults(handler=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    from ..bench import report
    from ..bench.driver import BenchOptions, run_benchmark, total_steps
    from ..bench.llama_cpp import check_build
    from ..bench.presets import cache_root
    from ..bench.progress import Progress
    from ..bench.runners import upstream_version

    if args.new_tokens < 2:
        raise UsageError("argument --new-tokens: must be >= 2 (decode time is measured between new tokens)")
    if args.no_compile and (args.user_compiled or args.max_autotune or args.quantization):
        raise UsageError("--user-compiled, --max-autotune and --quantization add compiled variants: drop --no-compile")
    if args.tp is not None:
        _check_tp_args(args)
    if args.prompt_lookup is not None:
        return _run_prompt_lookup(args)
    models = _bench_models(args)
    out = args.out or cache_root() / "bench"
    _check_writable(out)
    options = BenchOptions(
        models=models,
        batches=args.batch,
        prompt_lens=args.prompt_len,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        compile=not args.no_compile,
        upstream=not args.no_upstream and args.tp is None,  # --tp compares ours with ours
        dtype=getattr(torch, args.dtype),
        device=parse_device(args),
        out=out,
        seed=args.seed,
        user_compiled=args.user_compiled,
        max_autotune=args.max_autotune,
        quantization=args.quantization,
        llama_cpp=args.llama_cpp,
    )
    if options.llama_cpp is not None:
        try:
            check_build(options.llama_cpp)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if options.upstream and upstream_version() is None:
        print(f"{PROG}: upstream transformers is not installed: benchmarking ours only", file=sys.stderr)
    _warn_if_busy()
    if args.tp is not None:
        return _run_tensor_parallel(options, args.tp)
    with Progress(total_steps(options)) as bar:
        results = run_benchmark(options, bar)
    print(report.format_table(results, markdown=args.markdown))
    print(f"\nwrote {options.out / 'results.json'}" + (f" and {results['plot']}" if results["plot"] else ""))
    return 0


def _check_tp_args(args: argparse.Namespace) -> None:
    """--tp runs its own comparison (ours in one process vs over the ranks): refuse what it would not honour."""
    unused = {
        "--user-compiled": args.user_compiled,
        "--max-autotune": args.max_autotune,
        "--quantization": args.quantization,
        "--markdown": args.markdown,
        "--llama-cpp": args.llama_cpp,
    }
    given = [flag for flag, value in unused.items() if value]
    if given:
        raise UsageError(f"{', '.join(given)} cannot be combined with --tp (it compares ours eager and compiled only)")
    if parse_device(args).index is not None:
        raise UsageError(
            f"--tp: each rank runs on cuda:LOCAL_RANK or the CPU; pass --device cuda or cpu, not {args.device}"
        )


def _run_tensor_parallel(options: Any, world_size: int) -> int:
    from ..bench.tensor_parallel import format_tp_table, run_tp_benchmark

    results = run_tp_benchmark(options, world_size)
    print(format_tp_table(results))
    print(f"\nwrote {options.out / 'tp_results.json'}")
    return 0


def _run_prompt_lookup(args: argparse.Namespace) -> int:
    from ..bench.candidates import format_lookup_table, run_prompt_lookup_bench
    from ..bench.presets import DEFAULT_PRESET, cache_root, preset_path

    other = {"--tp": args.tp, "--user-compiled": args.user_compiled, "--quantization": args.quantization}
    other["--max-autotune"] = args.max_autotune
    other["--arch"] = args.arch
    if given := [flag for flag, value in other.items() if value]:
        raise UsageError(f"{', '.join(given)} cannot be combined with --prompt-lookup")
    if args.model_dir is not None and args.preset is not None:
        raise UsageError("give MODEL_DIR or --preset, not both")
    if args.preset is not None and len(args.preset) != 1:
        raise UsageError("--prompt-lookup runs one model: give one --preset")
    path = (
        model_dir_path(args.model_dir)
        if args.model_dir is not None
        else preset_path((args.preset or [DEFAULT_PRESET])[0])
    )
    out = args.out or cache_root() / "bench"
    _check_writable(out)
    _warn_if_busy()
    options = dict(new_tokens=args.new_tokens, repeats=args.repeats, device=parse_device(args), out=out)
    options["compile"] = not args.no_compile
    try:
        report = run_prompt_lookup_bench(
            path, num_tokens=args.prompt_lookup, dtype=getattr(torch, args.dtype), **options
        )
    except ValueError as err:
        raise UsageError(str(err)) from err
    print(format_lookup_table(report))
    print(f"\nwrote {out / 'prompt_lookup.json'}")
    return 0


def _check_writable(out: Path) -> None:
    """A usage error, before anything runs, when results could not be written to `out`."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        reason = err.strerror or str(err)
        raise UsageError(f"argument --out: cannot write results to {os.fspath(out)!r}: {reason}") from err


def _warn_if_busy() -> None:
    """Timings mean little on a machine busy with other work: say so up front."""
    from ..bench.measure import busy_warning

    warning = busy_warning()
    if warning is not None:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)


def _bench_models(args: argparse.Namespace) -> list[str]:
    """MODEL_DIR (a checkpoint directory or a GGUF file), else the presets named, else --arch's tiny preset."""
    if args.model_dir is not None:
        if args.preset is not None or args.arch is not None:
            raise UsageError("give MODEL_DIR or --preset / --arch, not both")
        return [str(model_dir_path(args.model_dir))]  # absolute: never read as a preset name
    if args.preset is None:
        return [DEFAULT_PRESET_FOR_ARCH[args.arch or "llama"]]
    for name in args.preset:
        preset = get_preset(name)
        if args.arch is not None and preset.model_type != args.arch:
            raise UsageError(f"preset {name!r} is a {preset.model_type} model, not --arch {args.arch}")
    if not args.preset:
        raise UsageError("argument --preset: expected at least one preset name")
    return args.preset
