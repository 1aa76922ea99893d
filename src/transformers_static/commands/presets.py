"""`transformers-static presets`: the embedded models and where their checkpoints are cached."""

from __future__ import annotations

import argparse
from typing import Any

from ..bench.presets import PRESETS, preset_dir


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("presets", help="list the embedded models (presets) and their cache paths")
    parser.set_defaults(handler=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    for preset in PRESETS.values():
        cached = (preset_dir(preset.name) / "config.json").is_file()
        print(f"{preset.name:<18} {preset.description}")
        print(f"{'':<18} {preset_dir(preset.name)}{'' if cached else ' (built on first use)'}")
    return 0
