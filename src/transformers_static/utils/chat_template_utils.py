"""Chat templates rendered as upstream renders them: jinja2's ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loopcontrols, a `tojson` that keeps non-ASCII and HTML characters, `raise_exception`,
`strftime_now`, and templates that only ever see plain JSON data."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

# A message's reasoning under its older names; templates read `reasoning_content` (gpt-oss ones read `thinking`).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


@lru_cache
def compile_chat_template(chat_template: str) -> Any:
    """The compiled jinja2 template (cached per template text)."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError(
            "apply_chat_template needs jinja2>=3.1.6: pip install 'transformers-static[tokenizers]'"
        ) from None
    if tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit()) < (3, 1, 6):
        raise ImportError(f"apply_chat_template needs jinja2>=3.1.6 (sandbox fixes), found {jinja2.__version__}")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=strftime_now,
        dict=_TemplateDict(),
        namespace=_namespace_class(jinja2),
    )
    return env.from_string(chat_template)


class _TemplateDict:
    """`dict(...)` inside templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _namespace_class(jinja2: Any) -> type:
    """jinja2's Namespace refusing underscore-prefixed names (no reach into CPython internals)."""

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    return TemplateNamespace


def plain_template_data(value: Any) -> Any:
    """`value` rebuilt from plain JSON types (str/int/float/bool/None, dicts, lists, tuples); anything else becomes
    a placeholder naming its type, e.g. "<Tensor>", so templates never call methods of rich objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for base in (str, int, float):
        if isinstance(value, base):  # subclasses (enums, numpy scalars) lose their extra methods
            return getattr(base, f"__{base.__name__}__")(value)
    if isinstance(value, Mapping):
        return {plain_template_data(k): plain_template_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_template_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_template_data(v) for v in value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):  # np.bool_(False) must stay falsy
        return plain_template_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_template_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return plain_template_data(value.model_dump())
    return f"<{type(value).__name__}>"


def render_chat(
    chat_template: str,
    chat: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    continue_final_message: bool | str,
    tools: list[dict] | None,
    documents: list[dict] | None,
    **template_kwargs: Any,
) -> str:
    """One conversation rendered; with `continue_final_message`, cut right after the final message's text."""
    template = compile_chat_template(chat_template)
    chat = _alias_reasoning_fields(plain_template_data(chat))
    if any(not isinstance(message, dict) for message in chat):
        raise TypeError(f"Chat messages should be dicts with 'role' and 'content', got {chat!r}")
    final = _tag_final_message(chat, chat_template, continue_final_message) if continue_final_message else None
    rendered = template.render(
        messages=chat,
        tools=plain_template_data(tools),
        documents=plain_template_data(documents),
        add_generation_prompt=add_generation_prompt,
        **plain_template_data(template_kwargs),
    )
    return rendered if final is None else _cut_at_tag(rendered, final)


def _alias_reasoning_fields(chat: list[Any]) -> list[Any]:
    aliased = []
    for message in chat:
        if isinstance(message, dict):
            reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def _tag_final_message(chat: list[dict], chat_template: str, continue_final_message: bool | str) -> str:
    """Append the continuation tag to the final message's field (in place); returns the field's original text."""
    if not chat:
        raise ValueError("continue_final_message is set but the conversation is empty!")
    field = continue_final_message if isinstance(continue_final_message, str) else "content"
    final = chat[-1].get(field)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{field}" to continue!')
    fields = [f for f in REASONING_FIELDS if chat[-1].get(f) == final] if field in REASONING_FIELDS else [field]
    if not any(f in chat_template for f in fields):
        raise ValueError(
            f'continue_final_message is set to "{field}" but this is not an accepted field in the chat_template'
        )
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final, block["text"] = block["text"], block["text"] + CONTINUE_TAG
                return final
        raise ValueError(
            "continue_final_message is set but we could not find any text to continue in the final message!"
        )
    for f in fields:
        chat[-1][f] = chat[-1][f] + CONTINUE_TAG
    return final


def _cut_at_tag(rendered: str, final: str) -> str:
    if final.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the chat after applying the chat "
            f"template! Final message to continue: {final.strip()}\nRendered chat:\n{rendered}"
        )
    at = rendered.rindex(CONTINUE_TAG.strip())
    return rendered[:at] if rendered[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG else rendered[:at].rstrip()


def is_valid_message(message: Any) -> bool:
    """A chat message: a dict with "role" and "content"."""
    return isinstance(message, dict) and "role" in message and "content" in message


class Chat:
    """A conversation given to a pipeline (so a list of messages is not mistaken for a batch)."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        if not all(is_valid_message(message) for message in messages):
            raise ValueError("When passing chat dicts as input, each dict must have a 'role' and 'content' key.")
        self.messages = messages
