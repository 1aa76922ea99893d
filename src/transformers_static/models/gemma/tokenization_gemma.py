"""GemmaTokenizer: BPE with byte fallback over "▁"-joined text, rebuilt from tokenizer.json as upstream's."""

from __future__ import annotations

from typing import Any

from ...tokenization_utils_tokenizers import TokenizersBackend, bpe_model
from ..llama.tokenization_llama import metaspace_decoder

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
        from tokenizers import Tokenizer, normalizers, pre_tokenizers

        if kwargs["vocab"] is None:
            kwargs["vocab"] = {str(kwargs[name]): i for i, name in enumerate(SPECIAL_TOKEN_ORDER)}
        unk = str(kwargs["unk_token"])
        backend = Tokenizer(bpe_model(kwargs, fuse_unk=True, unk_token=unk, byte_fallback=True))
        backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
        backend.decoder = metaspace_decoder(strip_prefix=False)
        backend.normalizer = normalizers.Replace(" ", "▁")
        return backend
