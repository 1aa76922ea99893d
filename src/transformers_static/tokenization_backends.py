"""The `tokenizers` pipelines that tokenizer classes and GGUF files build on: BPE models, the byte-level,
SentencePiece-style and Gemma pipelines over a vocab and merges, the split regexes, and what a model-specific
class reads from a tokenizer.json. It imports nothing of the library, so the tokenizer classes above it and the
GGUF tokenizer beside them share one recipe per pipeline."""

from __future__ import annotations

import base64
import json
from typing import Any

try:
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
except ImportError:  # the [tokenizers] extra
    Regex = Tokenizer = decoders = normalizers = pre_tokenizers = None

# Qwen2's pre-tokenizer split (also what llama.cpp calls the "qwen2" pre-tokenizer).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def bpe_model(kwargs: dict[str, Any], **options: Any) -> Any:
    """A BPE model over `kwargs["vocab"]` / `kwargs["merges"]` (popped), with the class's options."""
    from tokenizers.models import BPE

    return BPE(vocab=kwargs.pop("vocab") or {}, merges=kwargs.pop("merges", None) or [], dropout=None, **options)


def byte_level_bpe(kwargs: dict[str, Any], **options: Any) -> Any:
    """A `Tokenizer` with GPT-2's byte-level BPE model (no subword prefix or suffix, no unk fusing)."""
    return Tokenizer(bpe_model(kwargs, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, **options))


def gpt2_backend(kwargs: dict[str, Any]) -> Any:
    """GPT-2's pipeline: byte-level BPE, a plain ByteLevel pre-tokenizer (`kwargs["add_prefix_space"]`) and decoder."""
    backend = byte_level_bpe(kwargs)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=kwargs["add_prefix_space"])
    backend.decoder = decoders.ByteLevel()
    return backend


def metaspace_decoder(strip_prefix: bool) -> Any:
    """ "▁" back to spaces, byte pieces back to UTF-8; optionally the prepended space removed."""
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    return decoders.Sequence(steps + [decoders.Strip(content=" ", left=1)] * strip_prefix)


def llama_backend(kwargs: dict[str, Any], add_prefix_space: bool, legacy: bool) -> Any:
    """Llama's SentencePiece-style pipeline: BPE with byte fallback, a Metaspace pre-tokenizer prepending "▁" to the
    first word (every word with `legacy`; none without `add_prefix_space`)."""
    backend = Tokenizer(bpe_model(kwargs, fuse_unk=True, byte_fallback=True))
    scheme = ("always" if legacy else "first") if add_prefix_space else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    backend.decoder = metaspace_decoder(strip_prefix=add_prefix_space)
    return backend


def gemma_backend(kwargs: dict[str, Any], unk_token: str) -> Any:
    """Gemma's pipeline: BPE with byte fallback over text whose spaces become "▁", split after each space."""
    backend = Tokenizer(bpe_model(kwargs, fuse_unk=True, unk_token=unk_token, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    backend.decoder = metaspace_decoder(strip_prefix=False)
    backend.normalizer = normalizers.Replace(" ", "▁")
    return backend


def split_then_byte_level(regex: str, add_prefix_space: bool = False) -> Any:
    """A pre-tokenizer that splits with `regex` (isolating the matches), then maps bytes to GPT-2's alphabet."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
        ]
    )


def native_parts(tokenizer_file: str, model: str = "BPE") -> dict[str, Any]:
    """What a model-specific class over a `model` ("BPE" or "Unigram") takes from tokenizer.json (upstream's
    `convert_to_native_format`): the vocab (and BPE merges), a Unigram's SentencePiece charsmap, and the
    post-processor, padding and truncation (read from a copy without the vocab, to be cheap)."""
    with open(tokenizer_file, encoding="utf-8") as f:
        tokenizer_json = json.load(f)
    json_model = tokenizer_json.get("model", {})
    if json_model.get("type") not in (None, "Unigram"):
        minimal = {**tokenizer_json, "added_tokens": [], "model": {**json_model, "vocab": {}}}
        if json_model["type"] == "BPE":
            minimal["model"]["merges"] = []
        parsed = Tokenizer.from_str(json.dumps(minimal))
    else:
        parsed = Tokenizer.from_file(tokenizer_file)
    vocab = json_model.get("vocab")
    if isinstance(vocab, list):  # a Unigram's [piece, score] list: pieces with scores, or piece -> index for BPE
        if model == "Unigram":
            vocab = [tuple(item) for item in vocab]
        else:
            vocab = {token[0] if isinstance(token, list) else token: i for i, token in enumerate(vocab)}
    parts = {
        "post_processor": parsed.post_processor,
        "tokenizer_padding": parsed.padding,
        "tokenizer_truncation": parsed.truncation,
        "vocab": vocab,
    }
    if "merges" in json_model and model == "BPE":
        parts["merges"] = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json_model["merges"]]
    normalizer = tokenizer_json.get("normalizer") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    charsmaps = [step["precompiled_charsmap"] for step in steps if step.get("type") == "Precompiled"]
    if model == "Unigram" and charsmaps:
        parts["precompiled_charsmap"] = base64.b64decode(charsmaps[0])
    return parts
