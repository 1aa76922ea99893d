"""The `transformers-static` command (also `python -m transformers_static`), one module per subcommand:

    transformers-static generate   stream tokens from a checkpoint or a preset        (commands/generate.py)
    transformers-static bench      ours vs upstream, eager and compiled               (commands/bench.py)
    transformers-static presets    the embedded models and their cache paths          (commands/presets.py)
    transformers-static serve      an OpenAI-compatible server, continuous batching   (commands/serve.py)

Usage errors (unknown preset, a preset whose package is not installed, missing or invalid MODEL_DIR, bad ids,
--prompt without a tokenizer) print a message and exit with status 2, as argparse does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..bench.presets import PresetUnavailableError, UnknownPresetError
from . import bench, generate, presets, serve
from .args import PROG, UsageError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        try:
            return args.handler(args)
        except (UsageError, UnknownPresetError, PresetUnavailableError) as err:
            args.parser.error(str(err))  # prints usage and the message, raises SystemExit(2)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Static-mask generation that compiles once, and a benchmark against upstream."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (generate, bench, presets, serve):
        command.add_parser(commands)
    return parser
