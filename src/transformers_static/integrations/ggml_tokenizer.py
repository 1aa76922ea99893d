"""The tokenizer a GGUF file describes, rebuilt from its metadata as upstream transformers rebuilds it: a
`tokenizers.Tokenizer` (what tokenizer.json holds), the special tokens and the chat template.

A GGUF stores the vocabulary, merges (or scores), token types and special token ids under `tokenizer.ggml.*`:
`model` "gpt2" is a byte-level BPE, "llama" a SentencePiece BPE (Gemma's variant for Gemma files).
"""

from __future__ import annotations

import functools
from typing import Any

# `tokenizer.ggml.token_type` values (llama.cpp's): control tokens are special, user-defined ones are added.
CONTROL, USER_DEFINED = 3, 4
SPECIAL_TOKEN_IDS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

# llama.cpp pre-tokenizer names whose split regex upstream applies before the byte-level step (others keep GPT-2's).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
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
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
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
    """GPT-2-style byte-level BPE; tokens not spelled in the byte alphabet are respelled through it."""
    tk = _tokenizers()
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    respelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {token: index for index, token in enumerate(respelled)}
    merges = _merges(fields, vocab, {})
    model = tk.models.BPE(
        vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False
    )
    tokenizer = tk.Tokenizer(model)
    split = PRE_TOKENIZER_SPLITS.get(fields.get("tokenizer.ggml.pre"))
    if split is None:
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [
                tk.pre_tokenizers.Split(tk.Regex(split), behavior="isolated"),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = tk.decoders.ByteLevel()
    return tokenizer


def _sentencepiece(fields: dict[str, Any], tokens: list[str]) -> Any:
    """Llama's SentencePiece as a byte-fallback BPE: a "▁" is prepended to the first word only."""
    tk = _tokenizers()
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = _merges(fields, vocab, _scores(fields, tokens))
    tokenizer = tk.Tokenizer(
        tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tokenizer.decoder = tk.decoders.Sequence(
        [
            tk.decoders.Replace("▁", " "),
            tk.decoders.ByteFallback(),
            tk.decoders.Fuse(),
            tk.decoders.Strip(content=" ", left=1),
        ]
    )
    return tokenizer


def _gemma(fields: dict[str, Any], tokens: list[str]) -> Any:
    """Gemma's SentencePiece: spaces become "▁" (no prefix), whitespace-only tokens are stored as real spaces (so
    respelled), and merges follow the order of the tokens in the file (Gemma's scores do not)."""
    tk = _tokenizers()
    respelled = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(respelled)}
    merges = _merges(fields, vocab, {token: -index for index, token in enumerate(respelled)})
    model = tk.models.BPE(
        vocab=vocab, merges=merges, fuse_unk=True, unk_token="<unk>", dropout=None, byte_fallback=True
    )
    tokenizer = tk.Tokenizer(model)
    tokenizer.normalizer = tk.normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tokenizer.decoder = tk.decoders.Sequence(
        [tk.decoders.Replace("▁", " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
    )
    return tokenizer


# Tokens upstream's tokenizer classes mark special by default (when the vocabulary has them).
_DEFAULT_SPECIAL = {
    "byte_level": ("<|endoftext|>",),
    "sentencepiece": ("<unk>", "<s>", "</s>"),
    "gemma": ("<unk>", "<bos>", "<eos>", "<pad>", "<mask>"),
}
_BUILDERS = {"byte_level": _byte_level, "sentencepiece": _sentencepiece, "gemma": _gemma}


def _kind(fields: dict[str, Any]) -> str:
    model = fields.get("tokenizer.ggml.model")
    if model == "gpt2":
        return "byte_level"
    if model == "llama":
        return "gemma" if fields["general.architecture"] in GEMMA_ARCHITECTURES else "sentencepiece"
    raise ValueError(
        f"Cannot rebuild a tokenizer from GGUF tokenizer.ggml.model {model!r}; supported: 'gpt2' (byte-level BPE), "
        "'llama' (SentencePiece)"
    )


def special_tokens(fields: dict[str, Any]) -> dict[str, str | None]:
    """`{"bos_token": "<s>", ...}` from the file's special token ids (None where it names none)."""
    tokens = fields["tokenizer.ggml.tokens"]
    ids = {name: fields.get(f"tokenizer.ggml.{key}_token_id") for name, key in SPECIAL_TOKEN_IDS.items()}
    return {name: None if index is None else tokens[index] for name, index in ids.items()}


def gguf_tokenizer(fields: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`(tokenizers.Tokenizer, tokenizer_config)` from a GGUF file's metadata.

    The tokenizer holds what upstream's GGUF tokenizer holds: model, pre-tokenizer, decoder; the file's control
    tokens (and the named special tokens) as special added tokens, its user-defined tokens as plain added tokens;
    a post-processor adding BOS / EOS as `tokenizer.ggml.add_bos_token` / `add_eos_token` say (BOS by default for
    SentencePiece, as llama.cpp does). The config holds the special tokens, those two flags and the chat template.
    """
    tk = _tokenizers()
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError("The GGUF file has no tokenizer.ggml.tokens: it holds no tokenizer")
    kind = _kind(fields)
    tokens = fields["tokenizer.ggml.tokens"]
    tokenizer = _BUILDERS[kind](fields, tokens)
    named = special_tokens(fields)
    types = fields.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    spelled = set(bytes_to_unicode().values()) if kind == "byte_level" else None
    control = [
        t
        for t, kind_ in zip(tokens, types, strict=True)
        if kind_ == CONTROL and (spelled is None or set(t) <= spelled)
    ]
    vocab = tokenizer.get_vocab()
    special = [t for t in (*_DEFAULT_SPECIAL[kind], *control) if t in vocab]
    user_defined = [t for t, kind_ in zip(tokens, types, strict=True) if kind_ == USER_DEFINED and t in vocab]
    # The named special tokens last, and only those not added already (a user-defined one stays non-special).
    special += [t for t in named.values() if t in vocab and t not in special and t not in user_defined]
    tokenizer.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t in user_defined])
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", kind != "byte_level")) and named["bos_token"] is not None
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False)) and named["eos_token"] is not None
    tokenizer.post_processor = _post_processor(tokenizer, named, add_bos, add_eos)
    config = {**named, "add_bos_token": add_bos, "add_eos_token": add_eos}
    if "tokenizer.chat_template" in fields:
        config["chat_template"] = fields["tokenizer.chat_template"]
    return tokenizer, config


def _post_processor(tokenizer: Any, named: dict[str, str | None], add_bos: bool, add_eos: bool) -> Any:
    """`[BOS] $A [EOS]` (and `[BOS] $B:1 [EOS]` for pairs) with the flags' tokens, as upstream builds it."""
    tk = _tokenizers()
    bos, eos = named["bos_token"], named["eos_token"]
    single = f"{f'{bos}:0 ' if add_bos else ''}$A:0{f' {eos}:0' if add_eos else ''}"
    pair = f"{single}{f' {bos}:1' if add_bos else ''} $B:1{f' {eos}:1' if add_eos else ''}"
    ids = [(bos, tokenizer.token_to_id(bos))] * add_bos + [(eos, tokenizer.token_to_id(eos))] * add_eos
    return tk.processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)
