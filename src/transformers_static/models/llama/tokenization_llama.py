"""LlamaTokenizer: SentencePiece-style BPE with byte fallback, rebuilt from tokenizer.json's vocab and merges as
upstream's (Metaspace pre-tokenizer prepending "▁" to the first word unless `legacy=True`, no normalizer).

AutoTokenizer loads a checkpoint that names LlamaTokenizer but ships a byte-level tokenizer.json (Llama 3 style)
with TokenizersBackend instead, as upstream does."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import llama_backend
from ...tokenization_utils_tokenizers import TokenizersBackend


class LlamaTokenizer(TokenizersBackend):
    padding_side = "left"
    init_defaults = {
        "clean_up_tokenization_spaces": False,
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "use_default_system_prompt": False,
        "add_prefix_space": None,
    }

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        add_prefix_space = True if kwargs["add_prefix_space"] is None else kwargs["add_prefix_space"]
        legacy = kwargs.pop("legacy", False)
        if kwargs["vocab"] is None:
            kwargs["vocab"] = {str(kwargs[name]): i for i, name in enumerate(("unk_token", "bos_token", "eos_token"))}
        return llama_backend(kwargs, add_prefix_space=bool(add_prefix_space), legacy=legacy)
