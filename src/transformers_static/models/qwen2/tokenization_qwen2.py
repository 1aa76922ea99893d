"""Qwen2Tokenizer: byte-level BPE after Qwen's regex split and NFC, rebuilt from tokenizer.json as upstream's."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import QWEN2_PRETOKENIZE_REGEX as PRETOKENIZE_REGEX
from ...tokenization_backends import byte_level_bpe, split_then_byte_level
from ...tokenization_utils_tokenizers import AddedToken, TokenizersBackend


class Qwen2Tokenizer(TokenizersBackend):
    init_defaults = {
        "unk_token": "<|endoftext|>",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_prefix_space": None,
    }

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        from tokenizers import decoders, normalizers

        if kwargs["vocab"] is None:
            kwargs["vocab"] = {"<|endoftext|>": 0}
        backend = byte_level_bpe(kwargs, unk_token=None, byte_fallback=False)
        backend.decoder = decoders.ByteLevel()
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = split_then_byte_level(PRETOKENIZE_REGEX, bool(kwargs["add_prefix_space"]))
        return backend

    def _finish_init(self) -> None:
        self.add_tokens([AddedToken(token, special=True) for token in self.all_special_tokens])
