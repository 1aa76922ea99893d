"""`transformers-static serve`: an OpenAI-compatible HTTP server (see serving/), FastAPI on uvicorn.

The model is loaded as `generate` loads it (MODEL_DIR, a GGUF file, or a preset, default SmolLM2), its tokenizer
and chat template with it; uvicorn serves until SIGTERM / Ctrl-C, then stops taking connections, lets requests in
flight finish (up to --graceful-timeout seconds, then cancels them) and exits 0. With --tp under torchrun, the model
is split over the ranks (`tp_plan="auto"`): rank 0 serves HTTP and runs the engine, the other ranks run the same
forwards (serving/tensor_parallel.py) and exit when rank 0 stops.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
from pathlib import Path
from typing import Any

import torch

from ..bench.presets import DEFAULT_PRESET, PRESETS, checkpoint_path, preset_path
from ..cache_utils import DEFAULT_PREFILL_CHUNK_SIZE
from .args import (
    UsageError,
    add_device_args,
    add_quantization_arg,
    model_dir_path,
    parse_device,
    parse_dtype,
    positive_int,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server with continuous batching on static slots",
        description="Serve a checkpoint directory, a GGUF file or a preset (default "
        f"{DEFAULT_PRESET}) over HTTP with OpenAI's API: /v1/chat/completions, /v1/completions, /v1/models, "
        "/health, /metrics. Requests share --max-batch slots, each a row of one static cache; the decode step "
        "has one shape for every mix of requests. Needs the `serve` extra (pip install 'transformers-static[serve]').",
    )
    parser.add_argument("model_dir", nargs="?", metavar="MODEL_DIR", help="checkpoint directory or GGUF file")
    parser.add_argument("--preset", metavar="NAME", help=f"embedded model instead of MODEL_DIR: {', '.join(PRESETS)}")
    parser.add_argument("--model-name", help="the model id clients send (default: the preset or directory name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--max-batch", type=positive_int, default=8, metavar="N", help="slots: requests decoded at once"
    )
    parser.add_argument(
        "--max-len", type=positive_int, default=2048, metavar="N", help="per-slot context: prompt + completion tokens"
    )
    parser.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=DEFAULT_PREFILL_CHUNK_SIZE,
        metavar="N",
        help="prompt tokens per prefill forward: a joining request delays the others by one chunk at most",
    )
    parser.add_argument(
        "--compile", action="store_true", help="compile the forward once (two graphs: prefill chunk, decode step)"
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="CPU threads for the model (torch.set_num_threads; default torch's): on a shared machine, 1 avoids "
        "threads waiting on each other in every matrix product",
    )
    parser.add_argument(
        "--graceful-timeout", type=float, default=30.0, metavar="S", help="on SIGTERM, wait S seconds for requests"
    )
    parser.add_argument(
        "--tp", action="store_true", help="under torchrun: the model split over the ranks, rank 0 serves HTTP"
    )
    add_device_args(parser, default_dtype="auto")
    add_quantization_arg(parser, "int8 / int4 weight-only linear layers")
    parser.set_defaults(handler=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    from ..integrations.tensor_parallel import in_distributed_launch

    if args.tp and not in_distributed_launch():
        raise UsageError("--tp runs under torchrun: torchrun --nproc-per-node N -m transformers_static serve --tp ...")
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"serve needs {' and '.join(missing)}: pip install 'transformers-static[serve]'")
    import uvicorn

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    engine, name = build_engine(args)
    if args.tp:
        from ..integrations.tensor_parallel import leave_together
        from ..serving.tensor_parallel import BroadcastForward, follow

        if torch.distributed.get_rank() != 0:  # the other ranks run rank 0's forwards until it stops
            signal.signal(signal.SIGTERM, lambda signum, frame: None)  # rank 0 decides when to stop
            follow(engine)
            leave_together()
        engine.forward = BroadcastForward(engine)
    from ..serving.app import create_app

    app = create_app(engine, args.model_name or name)
    # uvicorn handles SIGTERM (graceful shutdown), then re-raises it to the handler found before it: this one, so
    # the process exits 0 once the requests in flight are done
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=args.graceful_timeout)
    if args.tp:
        leave_together()  # once the other ranks have seen the stop
    return 0


def build_engine(args: argparse.Namespace) -> tuple[Any, str]:
    """The Engine over the model and tokenizer `args` name, and the model's default id."""
    from ..generation.compilation import compile_forward
    from ..models.auto import AutoModelForCausalLM, AutoTokenizer
    from ..serving import Engine

    path, name = _checkpoint(args)
    if not (path / "tokenizer.json").is_file():
        raise UsageError(f"serve needs the checkpoint's tokenizer, and {str(path)!r} has no tokenizer.json")
    device = parse_device(args)
    tp_plan = "auto" if args.tp else None  # heads and MLP columns split over the ranks
    options = dict(dtype=parse_dtype(args), device_map=str(device), tp_plan=tp_plan, quantization=args.quantization)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **options).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot load MODEL_DIR {str(path)!r}: {err}") from err
    forward = compile_forward(model, "full") if args.compile else None
    try:
        engine = Engine(
            model,
            tokenizer,
            max_batch=args.max_batch,
            max_len=args.max_len,
            prefill_chunk=args.prefill_chunk,
            forward=forward,
        )
    except ValueError as err:
        raise UsageError(str(err)) from err
    return engine, name


def _checkpoint(args: argparse.Namespace) -> tuple[Path, str]:
    if args.model_dir is not None and args.preset is not None:
        raise UsageError("give MODEL_DIR or --preset, not both")
    if args.model_dir is None:
        preset = args.preset or DEFAULT_PRESET
        return preset_path(preset), preset
    path = model_dir_path(args.model_dir)
    return (checkpoint_path(path) if path.is_file() else path), path.stem if path.is_file() else path.name
