"""Qwen3_5Tokenizer: Qwen2's byte-level BPE with a split that keeps combining marks in words (`\\p{M}` joins
`\\p{L}`), and, as upstream's, no re-registration of the special tokens."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import byte_level_bpe, split_then_byte_level
from ...tokenization_utils_tokenizers import TokenizersBackend

PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)


class Qwen3_5Tokenizer(TokenizersBackend):
    init_defaults = {
        "unk_token": "<|endoftext|>",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_prefix_space": None,
    }
    saved_as_null = ("merges_file",)

    # Copied from transformers_static.models.qwen2.tokenization_qwen2.Qwen2Tokenizer.build_backend
    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        from tokenizers import decoders, normalizers

        if kwargs["vocab"] is None:
            kwargs["vocab"] = {"<|endoftext|>": 0}
        backend = byte_level_bpe(kwargs, unk_token=None, byte_fallback=False)
        backend.decoder = decoders.ByteLevel()
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = split_then_byte_level(PRETOKENIZE_REGEX, bool(kwargs["add_prefix_space"]))
        return backend
