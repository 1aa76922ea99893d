"""CohereTokenizer: byte-level BPE after NFC and a split of every digit, rebuilt from tokenizer.json as upstream's
(tokenizer.json's post-processor kept: Command-R's adds its bos). Command-R's tool-use and
grounded-generation prompts are its named chat templates ("tool_use", "rag")."""

from __future__ import annotations

from typing import Any

from ...tokenization_backends import byte_level_bpe
from ...tokenization_utils_tokenizers import TokenizersBackend

# The specials' ids in an empty vocabulary, as upstream's constructor lays them out.
SPECIAL_TOKEN_ORDER = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token")


class CohereTokenizer(TokenizersBackend):
    padding_side = "left"
    init_defaults = {
        "errors": "replace",
        "unk_token": "<UNK>",
        "bos_token": "<BOS_TOKEN>",
        "eos_token": "<|END_OF_TURN_TOKEN|>",
        "pad_token": "<PAD>",
        "cls_token": "<CLS>",
        "sep_token": "<SEP>",
        "mask_token": "<MASK_TOKEN>",
        "use_default_system_prompt": False,
        "add_prefix_space": False,
    }

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        from tokenizers import decoders, normalizers, pre_tokenizers

        if kwargs["vocab"] is None:
            kwargs["vocab"] = {str(kwargs[name]): i for i, name in enumerate(SPECIAL_TOKEN_ORDER)}
        add_prefix_space = bool(kwargs["add_prefix_space"])
        backend = byte_level_bpe(kwargs)
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, trim_offsets=True),
            ]
        )
        backend.decoder = decoders.ByteLevel(add_prefix_space=add_prefix_space, trim_offsets=True)
        return backend

    def apply_tool_use_template(self, conversation: list[dict[str, str]], tools: list[dict], **kwargs: Any) -> Any:
        """The conversation in Command-R's tool-use prompt (the "tool_use" chat template), listing `tools`."""
        return self.apply_chat_template(conversation, chat_template="tool_use", tools=tools, **kwargs)

    def apply_grounded_generation_template(
        self,
        conversation: list[dict[str, str]],
        documents: list[dict],
        citation_mode: str = "accurate",
        **kwargs: Any,
    ) -> Any:
        """The conversation in Command-R's retrieval-augmented prompt (the "rag" chat template) over `documents`;
        `citation_mode` is "accurate" or "fast"."""
        return self.apply_chat_template(
            conversation, chat_template="rag", documents=documents, citation_mode=citation_mode, **kwargs
        )
