"""`bench --llama-cpp DIR`: llama.cpp's figures measured on this host from a build's binaries (stand-ins here that
record their arguments and answer as llama-bench does), and the refusal of a folder without them."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from transformers_static.bench.llama_cpp import check_build, decode_ms_per_token

QUANTIZE = """#!/bin/sh
echo "$@" >> "{log}"
cp "$2" "$3"
"""
BENCH = """#!/bin/sh
echo "$@" >> "{log}"
case "$2" in
  *F32*) ts=50 ;;
  *Q4_0*) ts=200 ;;
  *) ts=100 ;;
esac
echo '[{{"n_prompt": 16, "n_gen": 0, "avg_ts": 999}}, {{"n_prompt": 0, "n_gen": 8, "avg_ts": '$ts'}}]'
"""


def fake_build(folder: Path) -> Path:
    folder.mkdir()
    for name, script in (("llama-quantize", QUANTIZE), ("llama-bench", BENCH)):
        tool = folder / name
        tool.write_text(script.format(log=folder / "calls.log"))
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return folder


def test_each_weight_type_is_requantized_once_and_its_decode_speed_read(tmp_path: Path) -> None:
    build, gguf = fake_build(tmp_path / "bin"), tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    kwargs = dict(prompt_len=16, new_tokens=8, repeats=2, threads=2, workdir=tmp_path / "work")
    figures = decode_ms_per_token(build, gguf, ["float32", "int4"], **kwargs)
    assert figures == {"float32": 20.0, "int4": 5.0}  # 1000 / the generation test's tokens per second
    decode_ms_per_token(build, gguf, ["float32"], **kwargs)  # the F32 file is reused
    calls = (build / "calls.log").read_text().splitlines()
    quantized = [line.split()[-1] for line in calls if line.startswith("--allow-requantize")]
    assert quantized == ["F32", "Q4_0"]
    benched = [line for line in calls if line.startswith("-m")]
    assert all("-t 2 -p 16 -n 8 -r 2 -o json" in line for line in benched) and len(benched) == 3


def test_a_folder_without_the_tools_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no llama-bench, llama-quantize there"):
        check_build(tmp_path)
