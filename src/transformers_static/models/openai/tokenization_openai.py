"""OpenAIGPTTokenizer: GPT-1's BPE with an end-of-word suffix "</w>", over lower-cased, BERT-normalised and
BERT-pre-tokenised text, rebuilt from tokenizer.json as upstream's."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import bpe_model
from ...tokenization_utils_tokenizers import TokenizersBackend

END_OF_WORD = "</w>"


class OpenAIGPTTokenizer(TokenizersBackend):
    init_defaults = {"unk_token": "<unk>"}

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers

        unk = str(kwargs["unk_token"])
        if kwargs["vocab"] is None:
            kwargs["vocab"] = {unk: 0}
        backend = Tokenizer(
            bpe_model(
                kwargs, continuing_subword_prefix="", end_of_word_suffix=END_OF_WORD, fuse_unk=False, unk_token=unk
            )
        )
        backend.normalizer = normalizers.BertNormalizer(lowercase=True)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.BPEDecoder(suffix=END_OF_WORD)
        return backend

    @property
    def do_lower_case(self) -> bool:
        return True
