"""The `transformers-static` command (also `python -m transformers_static`).

    transformers-static generate [MODEL_DIR | --preset NAME] (--prompt TEXT | --input-ids 1,2,3) [--max-new-tokens N]
                                 [--compile] [--sample --temperature T --top-k K --top-p P --seed S] [--dtype D]
    transformers-static bench [--arch ARCH | --preset NAME[,NAME]] [--batch 1,4] [--prompt-len 16,128]
                              [--new-tokens N] [--repeats N] [--out DIR] [--no-compile] [--no-upstream]
    transformers-static presets

Usage errors (unknown preset, missing or invalid MODEL_DIR, bad ids, --prompt without a tokenizer) print a message
and exit with status 2, as argparse does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .presets import DEFAULT_PRESET_FOR_ARCH, PRESETS, UnknownPresetError, get_preset, preset_dir, preset_path

PROG = "transformers-static"
DTYPES = ("auto", "float32", "bfloat16", "float16")


class UsageError(Exception):
    """Bad user input found after parsing: reported like an argparse error (exit status 2)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        try:
            return args.handler(args)
        except (UsageError, UnknownPresetError) as err:
            args.parser.error(str(err))  # prints usage and the message, raises SystemExit(2)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Static-mask generation that compiles once, and a benchmark against upstream."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_generate(commands)
    _add_bench(commands)
    presets = commands.add_parser("presets", help="list the embedded random-weight presets and their cache paths")
    presets.set_defaults(handler=run_presets, parser=presets)
    return parser


def _add_generate(commands: Any) -> None:
    parser = commands.add_parser(
        "generate",
        help="stream tokens from a checkpoint dir or a preset",
        description="Generate from a checkpoint directory (config.json + safetensors, tokenizer.json optional) "
        "or, without MODEL_DIR, from an embedded preset (default llama-tiny), streaming tokens as they come.",
    )
    parser.add_argument("model_dir", nargs="?", metavar="MODEL_DIR", help="checkpoint directory")
    parser.add_argument(
        "--preset", metavar="NAME", help=f"embedded random model instead of MODEL_DIR: {', '.join(PRESETS)}"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (needs MODEL_DIR/tokenizer.json and the tokenizers package)")
    source.add_argument("--input-ids", type=_id_list, metavar="1,2,3", help="prompt token ids, comma-separated")
    parser.add_argument("--max-new-tokens", type=_positive_int, default=32, metavar="N")
    parser.add_argument("--compile", action="store_true", help="generate(compile=True): compile the forward once")
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    _add_device_args(parser, default_dtype="auto")
    parser.set_defaults(handler=run_generate, parser=parser)


def _add_bench(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="ours vs upstream transformers, eager and compiled, on the same weights",
        description="Benchmark generation, in one process on one checkpoint: ours eager and compiled, upstream "
        "transformers eager and compiled (its static cache). Prints a table, writes results.json and bench.png.",
    )
    parser.add_argument("--arch", choices=sorted(DEFAULT_PRESET_FOR_ARCH), help="run this architecture's tiny preset")
    parser.add_argument(
        "--preset", type=_name_list, metavar="NAME[,NAME]", help="presets to run (default: llama-tiny)"
    )
    parser.add_argument("--batch", type=_int_list, default=[1], metavar="1,4", help="batch sizes (default 1)")
    parser.add_argument("--prompt-len", type=_int_list, default=[16], metavar="16,128", help="prompt lengths")
    parser.add_argument("--new-tokens", type=_positive_int, default=64, metavar="N", help="tokens per run (64)")
    parser.add_argument("--repeats", type=_positive_int, default=5, metavar="N", help="timed runs per variant (5)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where results.json and bench.png go (default: <cache>/bench)",
    )
    parser.add_argument("--no-compile", action="store_true", help="eager variants only (fast)")
    parser.add_argument("--no-upstream", action="store_true", help="ours only, even if transformers is installed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    _add_device_args(parser, default_dtype="float32")
    parser.set_defaults(handler=run_bench, parser=parser)


def _add_device_args(parser: argparse.ArgumentParser, default_dtype: str) -> None:
    choices = DTYPES if default_dtype == "auto" else DTYPES[1:]  # "auto": the checkpoint's own dtype
    parser.add_argument("--dtype", choices=choices, default=default_dtype, help=f"weights dtype ({default_dtype})")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available)")


# ---------------------------------------------------------------------- argument types
def _id_list(text: str) -> list[int]:
    """`"1,2,3"` -> [1, 2, 3]; the vocabulary range is checked once the model is known."""
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integer token ids like 1,2,3, got {text!r}"
        ) from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"token ids must be >= 0, got {text!r}")
    return ids


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers like 1,4, got {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _name_list(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _device(args: argparse.Namespace) -> torch.device:
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise UsageError(f"argument --device: {err}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("argument --device: CUDA is not available on this machine (use --device cpu)")
    return device


def _dtype(args: argparse.Namespace) -> torch.dtype | str:
    return "auto" if args.dtype == "auto" else getattr(torch, args.dtype)


# ---------------------------------------------------------------------- generate
def run_generate(args: argparse.Namespace) -> int:
    from .bench.measure import graphs_compiled
    from .generation import GenerationConfig
    from .models.auto import AutoConfig, AutoModelForCausalLM

    path = _checkpoint_dir(args)
    vocab_size = _load(path, lambda: AutoConfig.from_pretrained(path)).vocab_size
    input_ids, tokenizer = _prompt_ids(args, path, vocab_size)  # checked before the (slow) weight load
    sampling = _sampling_options(args, GenerationConfig)
    device = _device(args)
    model = _load(path, lambda: AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(args), device=device))
    streamer = PrintStreamer(tokenizer)
    generator = torch.Generator(device=model.device).manual_seed(args.seed) if args.sample else None
    graphs = graphs_compiled()
    start = time.perf_counter()
    model.generate(
        input_ids.to(model.device),
        max_new_tokens=args.max_new_tokens,
        streamer=streamer,
        generator=generator,
        compile=args.compile,
        **sampling,
    )
    elapsed = time.perf_counter() - start
    print(_generate_summary(streamer, elapsed, graphs_compiled() - graphs, args.compile), file=sys.stderr)
    return 0


def _checkpoint_dir(args: argparse.Namespace) -> Path:
    """MODEL_DIR, checked, or the (default) preset's checkpoint, built on first use."""
    if args.model_dir is not None and args.preset is not None:
        raise UsageError("give MODEL_DIR or --preset, not both")
    if args.model_dir is None:
        return preset_path(args.preset or "llama-tiny")
    path = Path(args.model_dir).expanduser()
    if not path.exists():
        raise UsageError(f"MODEL_DIR {str(path)!r} does not exist")
    if not path.is_dir():
        raise UsageError(f"MODEL_DIR {str(path)!r} is not a directory")
    if not (path / "config.json").is_file():
        raise UsageError(
            f"MODEL_DIR {str(path)!r} has no config.json: expected a checkpoint directory "
            "(config.json + model.safetensors), e.g. one written by save_pretrained"
        )
    return path


def _load(path: Path, load: Callable[[], Any]) -> Any:
    """`load()`, with a loading failure reported as an invalid MODEL_DIR."""
    try:
        return load()
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot load MODEL_DIR {str(path)!r}: {err}") from err


def _prompt_ids(args: argparse.Namespace, path: Path, vocab_size: int) -> tuple[torch.Tensor, Any]:
    """The prompt as ids `[1, prompt_len]`, and the tokenizer (None without one)."""
    tokenizer = load_tokenizer(path)
    if args.prompt is not None:
        if tokenizer is None:
            raise UsageError(f"--prompt needs a tokenizer, and {_tokenizer_problem(path)}; pass --input-ids 1,2,3")
        ids = tokenizer.encode(args.prompt).ids
        if not ids:
            raise UsageError("--prompt encodes to no tokens")
    else:
        ids = args.input_ids
    too_big = [i for i in ids if i >= vocab_size]
    if too_big:
        raise UsageError(
            f"argument --input-ids: id {too_big[0]} is out of range for the model's vocabulary of {vocab_size} "
            f"(valid ids 0..{vocab_size - 1})"
        )
    return torch.tensor([ids], dtype=torch.long), tokenizer


def load_tokenizer(path: Path) -> Any:
    """`tokenizers.Tokenizer` from `path/tokenizer.json`, or None when there is none or the package is missing."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        return Tokenizer.from_file(str(file))
    except Exception as err:  # the tokenizers package raises its own exception types
        raise UsageError(f"cannot read {str(file)!r}: {err}") from err


def _tokenizer_problem(path: Path) -> str:
    if (path / "tokenizer.json").is_file():
        return "the optional `tokenizers` package is not installed (pip install 'transformers-static[tokenizers]')"
    return f"{str(path)!r} has no tokenizer.json"


def _sampling_options(args: argparse.Namespace, config_class: type) -> dict[str, Any]:
    """generate() kwargs for greedy or sampled decoding, validated by GenerationConfig."""
    options: dict[str, Any] = {"do_sample": args.sample}
    if args.sample:
        options.update(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p)
    try:
        config_class(**options)
    except ValueError as err:
        raise UsageError(str(err)) from err
    return options


class PrintStreamer:
    """Prints new tokens as they come: decoded text with a tokenizer, else ids separated by spaces. Batch 1."""

    def __init__(self, tokenizer: Any = None, stream: Any = None) -> None:
        self.tokenizer = tokenizer
        self.stream = stream or sys.stdout
        self.prompt: list[int] | None = None
        self.ids: list[int] = []  # new tokens so far
        self.stamps: list[float] = []  # when each new token arrived
        self.printed = ""  # decoded text of the new tokens already printed

    def put(self, value: torch.Tensor) -> None:
        ids = value.reshape(-1).tolist()
        if self.prompt is None:  # generate's first put holds the prompt
            self.prompt = ids
            if self.tokenizer is not None:
                self._write(self.tokenizer.decode(ids, skip_special_tokens=True))
            return
        self.stamps.append(time.perf_counter())
        self.ids.extend(ids)
        if self.tokenizer is not None:
            self._write(self._new_text())
        else:
            self._write(" ".join(map(str, ids)) if len(self.ids) == len(ids) else " " + " ".join(map(str, ids)))

    def end(self) -> None:
        self._write("\n")

    def _new_text(self) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return ""
        new, self.printed = text[len(self.printed) :], text
        return new

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _generate_summary(streamer: PrintStreamer, elapsed: float, graphs: int, compiled: bool) -> str:
    """Tokens/s over the whole call, and the decode speed as the median gap between tokens (so a graph compiled
    at the first decode step does not count)."""
    count = len(streamer.ids)
    note = " (compilation included)" if compiled and graphs else ""
    summary = f"{count} tokens in {elapsed:.2f} s{note}: {count / elapsed:.1f} tokens/s"
    if count > 1:
        gaps = [b - a for a, b in zip(streamer.stamps, streamer.stamps[1:], strict=False)]
        gap = statistics.median(gaps)
        summary += f"; decode {gap * 1e3:.2f} ms/token ({1 / gap:.1f} tokens/s, median)"
    return f"{summary}; compiled graphs: {graphs}"


# ---------------------------------------------------------------------- bench
def run_bench(args: argparse.Namespace) -> int:
    from .bench import report
    from .bench.runners import upstream_version
    from .benchmark import BenchOptions, run_benchmark, total_steps
    from .presets import cache_root

    if args.new_tokens < 2:
        raise UsageError("argument --new-tokens: must be >= 2 (decode time is measured between new tokens)")
    options = BenchOptions(
        presets=_bench_presets(args),
        batches=args.batch,
        prompt_lens=args.prompt_len,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        compile=not args.no_compile,
        upstream=not args.no_upstream,
        dtype=getattr(torch, args.dtype),
        device=_device(args),
        out=args.out or cache_root() / "bench",
        seed=args.seed,
    )
    if options.upstream and upstream_version() is None:
        print(f"{PROG}: upstream transformers is not installed: benchmarking ours only", file=sys.stderr)
    _warn_if_busy()
    with _progress(total_steps(options)) as bar:
        results = run_benchmark(options, bar)
    print(report.format_table(results, markdown=args.markdown))
    print(f"\nwrote {options.out / 'results.json'}" + (f" and {results['plot']}" if results["plot"] else ""))
    return 0


def _warn_if_busy() -> None:
    """Timings mean little on a machine busy with other work: say so up front."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    if load > 0.5 * (os.cpu_count() or 1):
        print(
            f"{PROG}: warning: load average {load:.1f} on {os.cpu_count()} CPUs: timings will be noisy",
            file=sys.stderr,
        )


def _bench_presets(args: argparse.Namespace) -> list[str]:
    if args.preset is None:
        return [DEFAULT_PRESET_FOR_ARCH[args.arch or "llama"]]
    for name in args.preset:
        preset = get_preset(name)
        if args.arch is not None and preset.model_type != args.arch:
            raise UsageError(f"preset {name!r} is a {preset.model_type} model, not --arch {args.arch}")
    if not args.preset:
        raise UsageError("argument --preset: expected at least one preset name")
    return args.preset


class _Progress:
    """tqdm when installed, else a bar that prints nothing."""

    def __init__(self, total: int) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True, leave=False)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_description(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text, refresh=True)


def _progress(total: int) -> _Progress:
    return _Progress(total)


# ---------------------------------------------------------------------- presets
def run_presets(args: argparse.Namespace) -> int:
    for preset in PRESETS.values():
        cached = (preset_dir(preset.name) / "config.json").is_file()
        print(f"{preset.name:<18} {preset.description}")
        print(f"{'':<18} {preset_dir(preset.name)}{'' if cached else ' (built on first use)'}")
    return 0
