"""GPTNeoXTokenizer: byte-level BPE with NFC normalisation, rebuilt from tokenizer.json as upstream's; its
post-processor adds bos/eos only when asked (`add_bos_token=True` / `add_eos_token=True`)."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import byte_level_bpe
from ...tokenization_utils_tokenizers import TokenizersBackend


class GPTNeoXTokenizer(TokenizersBackend):
    init_defaults = {
        "errors": "replace",
        "unk_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|padding|>",
        "add_prefix_space": False,
        "trim_offsets": True,
    }

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        from tokenizers import decoders, normalizers, pre_tokenizers

        if kwargs["vocab"] is None:
            kwargs["vocab"] = {str(kwargs["unk_token"]): 0, str(kwargs["pad_token"]): 1}
        backend = byte_level_bpe(kwargs)
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(
            add_prefix_space=kwargs["add_prefix_space"], trim_offsets=kwargs["trim_offsets"]
        )
        backend.decoder = decoders.ByteLevel()
        return backend

    def _finish_init(self) -> None:
        self.update_post_processor()
