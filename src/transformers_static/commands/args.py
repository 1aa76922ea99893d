"""What every subcommand shares: the program name, usage errors, argument types and the device options."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

PROG = "transformers-static"
DTYPES = ("auto", "float32", "bfloat16", "float16")


class UsageError(Exception):
    """Bad user input found after parsing: reported like an argparse error (exit status 2)."""


def id_list(text: str) -> list[int]:
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


def int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers like 1,4, got {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
    return values


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def name_list(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def model_dir_path(text: str) -> Path:
    """MODEL_DIR checked: an existing checkpoint directory (with config.json) or a .gguf file, as an absolute path
    (so that a folder named like a preset, `./gpt2-tiny`, is never taken for the preset)."""
    path = Path(text).expanduser().absolute()
    if not path.exists():
        raise UsageError(f"MODEL_DIR {str(path)!r} does not exist")
    if path.is_file() and path.suffix == ".gguf":
        return path
    if not path.is_dir():
        raise UsageError(f"MODEL_DIR {str(path)!r} is neither a directory nor a .gguf file")
    if not (path / "config.json").is_file():
        raise UsageError(
            f"MODEL_DIR {str(path)!r} has no config.json: expected a checkpoint directory "
            "(config.json + model.safetensors), e.g. one written by save_pretrained, or a GGUF file"
        )
    return path


def add_device_args(parser: argparse.ArgumentParser, default_dtype: str) -> None:
    choices = DTYPES if default_dtype == "auto" else DTYPES[1:]  # "auto": the checkpoint's own dtype
    parser.add_argument("--dtype", choices=choices, default=default_dtype, help=f"weights dtype ({default_dtype})")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available)")


def add_quantization_arg(parser: argparse.ArgumentParser, help: str) -> None:
    from ..quantization import QUANTIZATION_METHODS

    parser.add_argument("--quantization", choices=QUANTIZATION_METHODS, default=None, help=help)


def parse_device(args: argparse.Namespace) -> torch.device:
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(name)
    except RuntimeError as err:
        raise UsageError(f"argument --device: {err}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("argument --device: CUDA is not available on this machine (use --device cpu)")
    return resolved


def parse_dtype(args: argparse.Namespace) -> torch.dtype | str:
    return "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
