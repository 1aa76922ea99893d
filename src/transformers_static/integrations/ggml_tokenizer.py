"""The tokenizer a GGUF file describes, rebuilt from its metadata as upstream transformers rebuilds it: a
`tokenizers.Tokenizer` (what tokenizer.json holds), the special tokens and the chat template.

A GGUF stores the vocabulary, merges (or scores), token types and special token ids under `tokenizer.ggml.*`:
`model` "gpt2" is a byte-level BPE (GPT-2's pipeline), "llama" a SentencePiece BPE (Llama's; Gemma's for Gemma
files, Llama's with a normalizer for Phi-3 files), the pipelines of `tokenization_backends`. What is GGUF-specific stays here: respelling, merges from scores,
split regexes. It reads plain metadata (from `modeling_gguf_pytorch_utils`) and imports no tokenizer class: the
class is chosen by the tokenizer loaders (`AutoTokenizer` by the file's model type, or the class called).
"""

from __future__ import annotations

import functools
from typing import Any

from ..tokenization_backends import (
    QWEN2_PRETOKENIZE_REGEX,
    gemma_backend,
    gpt2_backend,
    llama_backend,
    split_then_byte_level,
)

# `tokenizer.ggml.token_type` values (llama.cpp's): control tokens are special, user-defined ones are added.
CONTROL, USER_DEFINED = 3, 4
SPECIAL_TOKEN_IDS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

# llama.cpp pre-tokenizer names whose split regex upstream applies before the byte-level step (others keep GPT-2's).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), QWEN2_PRETOKENIZE_REGEX),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as err:
        raise ImportError("Rebuilding a GGUF tokenizer needs `tokenizers`: pip install tokenizers") from err
    return tokenizers


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: printable Latin-1 bytes map to themselves, the others (controls,
    space, ...) to characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in table)
    for offset, byte in enumerate(shifted):
        table[byte] = chr(256 + offset)
    return dict(sorted(table.items()))


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two vocabulary pieces, ordered
    by the token's score, best first (ties: longer left piece, then longer right piece first), as upstream orders
    them."""
    merges = []
    for token, score in scores.items():
        pairs = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        pairs.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges.extend((left, right, score) for left, right in pairs)
    merges.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _merges(fields: dict[str, Any], vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, ...]]:
    """The file's merges, else those its scores imply."""
    if "tokenizer.ggml.merges" in fields:
        return [tuple(merge.split(" ")) for merge in fields["tokenizer.ggml.merges"]]
    if not scores:
        raise ValueError("The GGUF tokenizer has neither tokenizer.ggml.merges nor tokenizer.ggml.scores")
    return merges_from_scores(vocab, scores)


def _scores(fields: dict[str, Any], tokens: list[str]) -> dict[str, float]:
    scores = fields.get("tokenizer.ggml.scores")
    return {} if scores is None else dict(zip(tokens, scores, strict=True))


def _byte_level(fields: dict[str, Any], tokens: list[str]) -> Any:
    """GPT-2's pipeline over the file's byte-level BPE; tokens not spelled in the byte alphabet are respelled through it,
    and text is split with the regex of the file's llama.cpp pre-tokenizer (if it names one)."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    respelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {token: index for index, token in enumerate(respelled)}
    backend = gpt2_backend({"vocab": vocab, "merges": _merges(fields, vocab, {}), "add_prefix_space": False})
    split = PRE_TOKENIZER_SPLITS.get(fields.get("tokenizer.ggml.pre"))
    if split is not None:
        backend.pre_tokenizer = split_then_byte_level(split)
    return backend


def _sentencepiece(fields: dict[str, Any], tokens: list[str]) -> Any:
    """Llama's pipeline over the file's SentencePiece vocabulary (merges from the file, else from its scores)."""
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = _merges(fields, vocab, _scores(fields, tokens))
    return llama_backend({"vocab": vocab, "merges": merges}, add_prefix_space=True, legacy=False)


def _gemma(fields: dict[str, Any], tokens: list[str]) -> Any:
    """Gemma's pipeline over the file's vocabulary: whitespace-only tokens are stored as real spaces (so respelled
    with "▁"), and merges follow the order of the tokens in the file (Gemma's scores do not)."""
    respelled = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(respelled)}
    merges = _merges(fields, vocab, {token: -index for index, token in enumerate(respelled)})
    return gemma_backend({"vocab": vocab, "merges": merges}, unk_token="<unk>")


def _phi3(fields: dict[str, Any], tokens: list[str]) -> Any:
    """Llama's pipeline, except that the prefix space comes from a normalizer ("▁" prepended, spaces respelled) and
    nothing pre-tokenizes: upstream's rule for Phi-3 files (what its repos' tokenizer.json does; a GGUF cannot say
    which a model wants, and it shows on text that starts with a space)."""
    normalizers = _tokenizers().normalizers
    backend = _sentencepiece(fields, tokens)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    return backend


_BUILDERS = {"byte_level": _byte_level, "sentencepiece": _sentencepiece, "gemma": _gemma, "phi3": _phi3}
# The special tokens (bos, eos, unk, pad, mask order) upstream's tokenizer class of each kind adds to the backend
# it builds (GPT2Tokenizer, LlamaTokenizer, GemmaTokenizer defaults), before the file's own tokens.
_CLASS_SPECIALS = {
    "byte_level": ("<|endoftext|>",),
    "sentencepiece": ("<s>", "</s>", "<unk>"),
    "phi3": ("<s>", "</s>", "<unk>"),
    "gemma": ("<bos>", "<eos>", "<unk>", "<pad>", "<mask>"),
}


def _kind(fields: dict[str, Any]) -> str:
    model = fields.get("tokenizer.ggml.model")
    if model == "gpt2":
        return "byte_level"
    if model == "llama":
        architecture = fields["general.architecture"]
        return (
            "gemma" if architecture in GEMMA_ARCHITECTURES else "phi3" if architecture == "phi3" else "sentencepiece"
        )
    raise ValueError(
        f"Cannot rebuild a tokenizer from GGUF tokenizer.ggml.model {model!r}; supported: 'gpt2' (byte-level BPE), "
        "'llama' (SentencePiece)"
    )


def special_tokens(fields: dict[str, Any]) -> dict[str, str | None]:
    """`{"bos_token": "<s>", ...}` from the file's special token ids (None where it names none)."""
    tokens = fields["tokenizer.ggml.tokens"]
    ids = {name: fields.get(f"tokenizer.ggml.{key}_token_id") for name, key in SPECIAL_TOKEN_IDS.items()}
    return {name: None if index is None else tokens[index] for name, index in ids.items()}


def gguf_tokenizer_kwargs(fields: dict[str, Any]) -> dict[str, Any]:
    """The init kwargs of a tokenizer class for a GGUF file, from its `tokenizer.*` and `general.architecture`
    metadata (`modeling_gguf_pytorch_utils.load_gguf_tokenizer_data`), as upstream's GGUF loading builds them:
    `tokenizer_object`, the pipeline of the vocabulary's kind (byte-level BPE, SentencePiece-style or Gemma's) over
    the file's tokens and merges with its class's default special tokens, then the file's control tokens added as
    special tokens and its user-defined ones as plain added tokens; the named special tokens (None where the file
    names none); add_bos_token / add_eos_token as `tokenizer.ggml.add_bos_token` / `add_eos_token` say (BOS by
    default for SentencePiece, as llama.cpp does); and the chat template. The tokenizer class that takes them
    builds the post-processor.
    """
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError("The GGUF file has no tokenizer.ggml.tokens: it holds no tokenizer")
    tk = _tokenizers()
    kind = _kind(fields)
    tokens = fields["tokenizer.ggml.tokens"]
    backend = _BUILDERS[kind](fields, tokens)
    backend.add_tokens([tk.AddedToken(t, special=True) for t in _CLASS_SPECIALS[kind]])
    types = fields.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    spelled = set(bytes_to_unicode().values()) if kind == "byte_level" else None
    control = [
        t
        for t, kind_ in zip(tokens, types, strict=True)
        if kind_ == CONTROL and (spelled is None or set(t) <= spelled)
    ]
    backend.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in control])
    vocab = backend.get_vocab()
    user_defined = [t for t, kind_ in zip(tokens, types, strict=True) if kind_ == USER_DEFINED and t in vocab]
    backend.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t in user_defined])
    kwargs = {
        "tokenizer_object": backend,
        **special_tokens(fields),
        "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", kind != "byte_level")),
        "add_eos_token": bool(fields.get("tokenizer.ggml.add_eos_token", False)),
    }
    if "tokenizer.chat_template" in fields:
        kwargs["chat_template"] = fields["tokenizer.chat_template"]
    return kwargs
