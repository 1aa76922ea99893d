"""GPT2Tokenizer: byte-level BPE, rebuilt from tokenizer.json's vocab and merges as upstream's (a plain ByteLevel
pre-tokenizer and decoder, no normalizer: whatever else tokenizer.json holds is dropped, as upstream drops it)."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import gpt2_backend
from ...tokenization_utils_tokenizers import TokenizersBackend


class GPT2Tokenizer(TokenizersBackend):
    init_defaults = {
        "errors": "replace",
        "unk_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": None,
        "add_prefix_space": False,
    }

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        return gpt2_backend(kwargs)
