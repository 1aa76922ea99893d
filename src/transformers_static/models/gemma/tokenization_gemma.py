"""GemmaTokenizer: BPE with byte fallback over "▁"-joined text, rebuilt from tokenizer.json as upstream's."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import gemma_backend
from ...tokenization_utils_tokenizers import TokenizersBackend

SPECIAL_TOKEN_ORDER = ("pad_token", "eos_token", "bos_token", "unk_token", "mask_token")


class GemmaTokenizer(TokenizersBackend):
    padding_side = "left"
    init_defaults = {
        "unk_token": "<unk>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    }

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        if kwargs["vocab"] is None:
            kwargs["vocab"] = {str(kwargs[name]): i for i, name in enumerate(SPECIAL_TOKEN_ORDER)}
        return gemma_backend(kwargs, unk_token=str(kwargs["unk_token"]))
