"""Qwen2Tokenizer: byte-level BPE after Qwen's regex split and NFC, rebuilt from tokenizer.json as upstream's."""

from __future__ import annotations

from typing import Any

from ...tokenization_utils_tokenizers import AddedToken, TokenizersBackend, byte_level_bpe

PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


class Qwen2Tokenizer(TokenizersBackend):
    init_defaults = {
        "unk_token": "<|endoftext|>",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_prefix_space": None,
    }

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        from tokenizers import Regex, decoders, normalizers, pre_tokenizers

        if kwargs["vocab"] is None:
            kwargs["vocab"] = {"<|endoftext|>": 0}
        backend = byte_level_bpe(kwargs, unk_token=None, byte_fallback=False)
        backend.decoder = decoders.ByteLevel()
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=bool(kwargs["add_prefix_space"]), use_regex=False),
            ]
        )
        return backend

    def _finish_init(self) -> None:
        self.add_tokens([AddedToken(token, special=True) for token in self.all_special_tokens])
