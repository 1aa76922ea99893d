"""Chat templates on a tokenizer (upstream's `get_chat_template`, `apply_chat_template`, and the
chat_template.jinja / additional_chat_templates/ files), as a mixin of `PreTrainedTokenizerBase`: the rendering
itself is `utils.chat_template_utils`."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from .tokenization_files import CHAT_TEMPLATE_DIR, CHAT_TEMPLATE_FILE
from .utils.chat_template_utils import render_chat

if TYPE_CHECKING:
    import torch

    from .tokenization_utils_base import BatchEncoding


class ChatTemplateMixin:
    """What a tokenizer with `chat_template` (a string, or a dict of named templates) and `special_tokens_map`
    renders and saves."""

    def get_chat_template(self, chat_template: str | None = None, tools: list[dict] | None = None) -> str:
        """The template to render: `chat_template` (a template or the name of one), else the tokenizer's."""
        if isinstance(self.chat_template, dict):
            templates = self.chat_template
            if chat_template is not None and chat_template in templates:
                return templates[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in templates:
                    return templates["tool_use"]
                if "default" in templates:
                    return templates["default"]
                raise ValueError(
                    "This model has multiple chat templates with no default specified! Please either pass a chat "
                    "template or the name of the template you wish to use to the `chat_template` argument. Available "
                    f"template names are {sorted(templates)}."
                )
        if chat_template is None:
            if self.chat_template is None:
                raise ValueError(
                    "Cannot use chat template functions because tokenizer.chat_template is not set and no template "
                    "argument was passed!"
                )
            return self.chat_template
        return chat_template

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]] | list[list[dict[str, Any]]],
        tools: list[dict] | None = None,
        documents: list[dict[str, str]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_dict: bool = True,
        tokenizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> str | list[str] | list[int] | list[list[int]] | torch.Tensor | BatchEncoding:
        """Render one conversation (a list of {"role", "content"} dicts) or a batch of them with the chat template,
        then tokenize without adding special tokens. Returns the text when `tokenize=False`, else a BatchEncoding
        (`return_dict=True`, upstream 5's default) or the input ids. Extra kwargs reach the template."""
        for name in ("return_assistant_tokens_mask", "sanitize_control_tokens"):
            if kwargs.pop(name, False):
                raise NotImplementedError(f"apply_chat_template({name}=True) is not supported by transformers_static")
        template = self.get_chat_template(chat_template, tools)
        if isinstance(conversation, (list, tuple)) and not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        batched = isinstance(conversation[0], (list, tuple)) or hasattr(conversation[0], "messages")
        chats = [getattr(c, "messages", c) for c in conversation] if batched else [conversation]
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        if tools is not None and any(not isinstance(tool, dict) for tool in tools):
            raise NotImplementedError("tools must be JSON-schema dicts here (callables are not converted)")
        if documents is not None and any(not isinstance(doc, dict) for doc in documents):
            raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
        rendered = [
            render_chat(
                template,
                [{k: v for k, v in message.items() if v is not None} for message in chat],
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                documents=documents,
                **{**self.special_tokens_map, **kwargs},
            )
            for chat in chats
        ]
        text = rendered if batched else rendered[0]
        if not tokenize:
            return text
        out = self(
            text,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            add_special_tokens=False,
            return_tensors=return_tensors,
            **(tokenizer_kwargs or {}),
        )
        return out if return_dict else out["input_ids"]

    def _save_chat_templates(self, save_directory: str, config: dict[str, Any]) -> list[str]:
        """chat_template.jinja for the default template, additional_chat_templates/<name>.jinja for the others."""
        config.pop("chat_template", None)
        templates = {"default": self.chat_template} if isinstance(self.chat_template, str) else self.chat_template
        saved = []
        for name, template in (templates or {}).items():
            if name == "default":
                file = os.path.join(save_directory, CHAT_TEMPLATE_FILE)
            else:
                if not re.fullmatch(r"[\w.-]+", name) or name.startswith("."):
                    raise ValueError(f"Invalid chat template name: {name!r}")
                os.makedirs(os.path.join(save_directory, CHAT_TEMPLATE_DIR), exist_ok=True)
                file = os.path.join(save_directory, CHAT_TEMPLATE_DIR, f"{name}.jinja")
            with open(file, "w", encoding="utf-8") as f:
                f.write(template)
            saved.append(file)
        return saved
