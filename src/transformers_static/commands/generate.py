"""`transformers-static generate`: stream tokens from a checkpoint directory, a GGUF file or an embedded preset.

transformers-static generate [MODEL_DIR | FILE.gguf | --preset NAME] (--prompt TEXT [--chat] | --input-ids 1,2,3)
                             [--max-new-tokens N] [--compile] [--sample --temperature T --top-k K --top-p P --seed S]
                             [--num-beams N] [--num-return-sequences N] [--prompt-lookup K | --assistant DIR]
                             [--dtype D] [--quantization int8|int4] [--compile-cache DIR]

Under `torchrun --nproc-per-node N -m transformers_static generate ...` the model is split over the N ranks
(`tp_plan="auto"`); every rank generates the same tokens and only rank 0 prints.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..bench.presets import DEFAULT_PRESET, PRESETS, checkpoint_path, preset_path
from ..generation.streamers import TextStreamer
from .args import (
    UsageError,
    add_device_args,
    add_quantization_arg,
    id_list,
    model_dir_path,
    parse_device,
    parse_dtype,
    positive_int,
)

# generate() options given only with --sample; those not given come from the checkpoint's generation_config.json.
SAMPLING_ARGS = ("temperature", "top_k", "top_p")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "generate",
        help="stream tokens from a checkpoint dir, a GGUF file or a preset",
        description="Generate from a checkpoint directory (config.json + safetensors, tokenizer files optional), a "
        f"GGUF file (converted once into the cache), or an embedded preset (default {DEFAULT_PRESET}), streaming "
        "tokens as they come.",
    )
    parser.add_argument("model_dir", nargs="?", metavar="MODEL_DIR", help="checkpoint directory or GGUF file")
    parser.add_argument("--preset", metavar="NAME", help=f"embedded model instead of MODEL_DIR: {', '.join(PRESETS)}")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (needs the checkpoint's tokenizer files)")
    source.add_argument("--input-ids", type=id_list, metavar="1,2,3", help="prompt token ids, comma-separated")
    parser.add_argument(
        "--chat", action="store_true", help="send --prompt as a user message through the model's chat template"
    )
    parser.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="N")
    parser.add_argument("--compile", action="store_true", help="generate(compile=True): compile the forward once")
    parser.add_argument(
        "--compile-cache",
        type=Path,
        metavar="DIR",
        help="keep the compiler's caches in DIR (TORCHINDUCTOR_CACHE_DIR): a later run's first call compiles "
        "from them (default: inductor's own, under the temp dir)",
    )
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    checkpoints = "with --sample (default: the checkpoint's generation_config.json)"
    parser.add_argument("--temperature", type=float, metavar="T", help=checkpoints)
    parser.add_argument("--top-k", type=int, metavar="K", help=checkpoints)
    parser.add_argument("--top-p", type=float, metavar="P", help=checkpoints)
    parser.add_argument(
        "--seed", type=int, help="with --sample: seed of the sampling generator, the same on every rank (0)"
    )
    parser.add_argument("--num-beams", type=positive_int, default=1, metavar="N", help="beam search with N beams")
    parser.add_argument(
        "--num-return-sequences",
        type=positive_int,
        default=1,
        metavar="N",
        help="print N sequences: the N best beams (N <= --num-beams), or N samples with --sample",
    )
    parser.add_argument(
        "--prompt-lookup",
        type=positive_int,
        metavar="K",
        help="prompt-lookup decoding: verify up to K draft tokens copied from the text per forward",
    )
    parser.add_argument(
        "--assistant",
        metavar="DIR",
        help="assisted decoding: a smaller checkpoint (directory or GGUF file, same tokenizer) drafts tokens that "
        "the model verifies, --num-assistant-tokens per forward",
    )
    parser.add_argument(
        "--num-assistant-tokens",
        type=positive_int,
        metavar="K",
        help="with --assistant: drafts per verify forward (default: the assistant's generation config, else 20)",
    )
    add_device_args(parser, default_dtype="auto")
    add_quantization_arg(parser, "int8 / int4 weight-only linear layers (from_pretrained(..., quantization=...))")
    parser.set_defaults(handler=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    from ..bench.measure import graphs_compiled
    from ..generation import GenerationConfig
    from ..generation.assisted_decoding import check_assistant
    from ..integrations.tensor_parallel import in_distributed_launch
    from ..models.auto import AutoConfig, AutoModelForCausalLM

    sampling = {**_sampling_options(args, GenerationConfig), **_decoding_options(args, GenerationConfig)}
    path = _checkpoint_dir(args)
    if args.compile_cache is not None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(args.compile_cache.expanduser().resolve())
    vocab_size = _load(path, lambda: AutoConfig.from_pretrained(path)).vocab_size
    input_ids, tokenizer = _prompt_ids(args, path, vocab_size)  # checked before the (slow) weight load
    device = parse_device(args)
    tp_plan = "auto" if in_distributed_launch() else None  # torchrun: split the model over the ranks
    options = dict(dtype=parse_dtype(args), device_map=str(device), tp_plan=tp_plan, quantization=args.quantization)
    model = _load(path, lambda: AutoModelForCausalLM.from_pretrained(path, **options))
    if args.assistant is not None:
        if tp_plan is not None:
            raise UsageError("--assistant is not supported under torchrun (tensor parallelism)")
        draft_path = _checkpoint_dir(argparse.Namespace(model_dir=args.assistant, preset=None))
        draft_options = {**options, "tp_plan": None}
        draft = _load(
            draft_path, lambda: AutoModelForCausalLM.from_pretrained(draft_path, **draft_options), "--assistant"
        )
        try:
            check_assistant(model, draft)
        except ValueError as err:
            raise UsageError(f"--assistant {args.assistant}: {err}") from err
        sampling["assistant_model"] = draft
    printing = tp_plan is None or torch.distributed.get_rank() == 0
    stream = None if printing else io.StringIO()  # other ranks: kept, not shown
    streamer = PrintStreamer(tokenizer, stream=stream, skip_prompt=args.chat)
    generator = torch.Generator(device=model.device).manual_seed(args.seed or 0) if args.sample else None
    streaming = args.num_beams == 1 and args.num_return_sequences == 1
    graphs = graphs_compiled()
    start = time.perf_counter()
    try:
        sequences = model.generate(
            input_ids.to(model.device),
            max_new_tokens=args.max_new_tokens,
            streamer=streamer if streaming else None,
            generator=generator,
            compile=args.compile,
            **sampling,
        )
    except NotImplementedError as err:
        raise UsageError(str(err)) from err
    elapsed = time.perf_counter() - start
    if not streaming:  # beams, several sequences: printed once done, one line per sequence
        for row in sequences.cpu():
            streamer.prompt_seen = False
            streamer.put(input_ids[0])
            streamer.put(row[input_ids.shape[1] :])
            streamer.end()
    if printing:
        summary = _generate_summary(streamer, elapsed, graphs_compiled() - graphs, args.compile, streaming)
        print(summary, file=sys.stderr)
    if tp_plan is not None:
        from ..integrations.tensor_parallel import end_command

        end_command()
    return 0


def _checkpoint_dir(args: argparse.Namespace) -> Path:
    """MODEL_DIR (a checkpoint directory, or a GGUF file converted once), checked, or the (default) preset's
    checkpoint, built on first use."""
    if args.model_dir is not None and args.preset is not None:
        raise UsageError("give MODEL_DIR or --preset, not both")
    if args.model_dir is None:
        return preset_path(args.preset or DEFAULT_PRESET)
    path = model_dir_path(args.model_dir)
    return _load(path, lambda: checkpoint_path(path)) if path.is_file() else path  # a file: a GGUF one


def _load(path: Path, load: Callable[[], Any], argument: str = "MODEL_DIR") -> Any:
    """`load()`, with a loading failure reported as an invalid `argument`."""
    try:
        return load()
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"cannot load {argument} {str(path)!r}: {err}") from err


def _prompt_ids(args: argparse.Namespace, path: Path, vocab_size: int) -> tuple[torch.Tensor, Any]:
    """The prompt as ids `[1, prompt_len]` (through the chat template with --chat), and the tokenizer (None
    without one)."""
    tokenizer = load_tokenizer(path)
    if args.chat and args.prompt is None:
        raise UsageError("--chat needs --prompt (a user message)")
    if args.prompt is not None:
        if tokenizer is None:
            raise UsageError(f"--prompt needs a tokenizer, and {_tokenizer_problem(path)}; pass --input-ids 1,2,3")
        if args.chat:
            if tokenizer.chat_template is None:
                raise UsageError(f"--chat needs a chat template, and {str(path)!r}'s tokenizer has none")
            messages = [{"role": "user", "content": args.prompt}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        else:
            ids = tokenizer.encode(args.prompt)
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
    """The checkpoint's tokenizer (`AutoTokenizer`), or None when it has no tokenizer.json or the optional
    tokenizers package is missing."""
    if not (path / "tokenizer.json").is_file() or importlib.util.find_spec("tokenizers") is None:
        return None
    from ..models.auto import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load the tokenizer of {str(path)!r}: {err}") from err


def _tokenizer_problem(path: Path) -> str:
    if (path / "tokenizer.json").is_file():
        return "the optional `tokenizers` package is not installed (pip install 'transformers-static[tokenizers]')"
    return f"{str(path)!r} has no tokenizer.json"


def _sampling_options(args: argparse.Namespace, config_class: type) -> dict[str, Any]:
    """generate() kwargs for greedy or sampled decoding, validated by GenerationConfig: with --sample, only the
    sampling options given (the checkpoint's generation config supplies the others); without it, none may be given."""
    given = {name: getattr(args, name) for name in SAMPLING_ARGS if getattr(args, name) is not None}
    if not args.sample:
        flags = [f"--{name.replace('_', '-')}" for name in [*given, "seed"] if getattr(args, name) is not None]
        if flags:
            raise UsageError(f"{', '.join(flags)} only apply with --sample (greedy decoding does not sample)")
        return {"do_sample": False}
    options: dict[str, Any] = {"do_sample": True, **given}
    try:
        config_class(**options)
    except ValueError as err:
        raise UsageError(str(err)) from err
    return options


def _decoding_options(args: argparse.Namespace, config_class: type) -> dict[str, Any]:
    """generate() kwargs for beam search, several sequences, prompt lookup and assisted decoding, validated by
    GenerationConfig."""
    options: dict[str, Any] = {"num_beams": args.num_beams, "num_return_sequences": args.num_return_sequences}
    if args.prompt_lookup is not None:
        options["prompt_lookup_num_tokens"] = args.prompt_lookup
    if args.num_assistant_tokens is not None:
        if args.assistant is None:
            raise UsageError("--num-assistant-tokens only applies with --assistant")
        options["num_assistant_tokens"] = args.num_assistant_tokens
    try:
        config = config_class(do_sample=args.sample, **options)
        config.check_supported()
    except (ValueError, NotImplementedError) as err:
        raise UsageError(str(err)) from err
    return options


class PrintStreamer(TextStreamer):
    """`TextStreamer` (special tokens skipped) writing to `stream` and timing each new token; without a tokenizer,
    the new ids separated by spaces. Batch 1."""

    def __init__(self, tokenizer: Any = None, stream: Any = None, skip_prompt: bool = False) -> None:
        super().__init__(tokenizer, skip_prompt=skip_prompt, skip_special_tokens=True)
        self.stream = stream or sys.stdout
        self.prompt_seen = False
        self.count = 0  # new tokens so far
        self.stamps: list[float] = []  # when each new token arrived

    def put(self, value: torch.Tensor) -> None:
        is_prompt, self.prompt_seen = not self.prompt_seen, True  # generate's first put holds the prompt
        if not is_prompt:
            self.stamps.append(time.perf_counter())
            self.count += value.numel()
        if self.tokenizer is not None:
            super().put(value)
        elif not is_prompt:
            ids = " ".join(map(str, value.reshape(-1).tolist()))
            self.on_finalized_text(ids if self.count == value.numel() else " " + ids)

    def end(self) -> None:
        if self.tokenizer is not None:
            super().end()
        else:
            self.on_finalized_text("", stream_end=True)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.stream.write(text + "\n" if stream_end else text)
        self.stream.flush()


def _generate_summary(
    streamer: PrintStreamer, elapsed: float, graphs: int, compiled: bool, streamed: bool = True
) -> str:
    """Tokens/s over the whole call, and (streamed) the decode speed as the median gap between tokens (so a graph
    compiled at the first decode step does not count)."""
    count = streamer.count
    note = " (compilation included)" if compiled and graphs else ""
    summary = f"{count} tokens in {elapsed:.2f} s{note}: {count / elapsed:.1f} tokens/s"
    if count > 1 and streamed:
        gaps = [b - a for a, b in zip(streamer.stamps, streamer.stamps[1:], strict=False)]
        gap = statistics.median(gaps)
        summary += f"; decode {gap * 1e3:.2f} ms/token ({1 / gap:.1f} tokens/s, median)"
    return f"{summary}; compiled graphs: {graphs}"
