"""A tokenizer's files: the names upstream gives them, reading a directory's (or a GGUF's) tokenizer settings for a
class's `__init__` (`load_tokenizer`, `read_tokenizer_files`), and AddedToken (de)serialisation for
tokenizer_config.json. It imports no tokenizer class: the loaders pass the class they chose."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .integrations.ggml_tokenizer import gguf_tokenizer_kwargs
from .modeling_gguf_pytorch_utils import load_gguf_tokenizer_data

if TYPE_CHECKING:
    from .tokenization_utils_base import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
ADDED_TOKENS_FILE = "added_tokens.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
UPSTREAM_VERSION = (5, 23, 0)  # the transformers version whose files and behaviour this follows
TOKENIZERS_MISSING = "Tokenizers need the tokenizers library: pip install 'transformers-static[tokenizers]'"


def _refuse_fix_mistral_regex(settings: dict[str, Any], where: str) -> None:
    """Upstream's `fix_mistral_regex` (a kwarg, or a tokenizer_config.json key) patches the pre-tokenizer regex of
    some Mistral tokenizers; not implemented here, so refused when set rather than ignored."""
    if settings.get("fix_mistral_regex"):
        raise NotImplementedError(
            f"{where} sets fix_mistral_regex={settings['fix_mistral_regex']!r}: upstream's patch of Mistral's "
            "pre-tokenizer regex is not supported by transformers-static"
        )


def load_tokenizer(
    select_class: Callable[[str], type[PreTrainedTokenizerBase]],
    pretrained_model_name_or_path: str | os.PathLike,
    *,
    caller: str,
    revision: str | None = None,
    local_files_only: bool = False,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    gguf_file: str | None = None,
    **kwargs: Any,
) -> PreTrainedTokenizerBase:
    """The tokenizer of a directory or a Hub id (the local Hugging Face cache first, see `resolve_pretrained_path`),
    of the class `select_class(directory)` picks, built from its files, or from the metadata of its `gguf_file`
    (the GGUF's backend, special tokens, add_bos_token / add_eos_token and chat template, as upstream builds them),
    with `kwargs` on top. `trust_remote_code` is ignored with a warning; `subfolder`, `force_download`, `proxies`
    and a set `fix_mistral_regex` are refused, naming `caller`."""
    from .utils.hub import refuse_unsupported_hub_arguments, resolve_pretrained_path

    refuse_unsupported_hub_arguments(caller, kwargs)
    _refuse_fix_mistral_regex(kwargs, caller)
    if kwargs.pop("trust_remote_code", None):
        logger.warning("trust_remote_code=True is ignored: transformers_static runs no remote code")
    name = os.fspath(pretrained_model_name_or_path)
    path = resolve_pretrained_path(
        name,
        revision=revision,
        local_files_only=local_files_only,
        cache_dir=cache_dir,
        token=token,
        weights=False,
        gguf_file=gguf_file,
    )
    tokenizer_class = select_class(path)
    if gguf_file is not None:
        gguf_data = load_gguf_tokenizer_data(os.path.join(path, gguf_file))
        init_kwargs = {**gguf_tokenizer_kwargs(gguf_data), **kwargs}
    else:
        init_kwargs = read_tokenizer_files(path, kwargs, tokenizer_class.SPECIAL_TOKENS_ATTRIBUTES)
    init_kwargs.update(name_or_path=name, is_local=os.path.isdir(name), local_files_only=local_files_only)
    return tokenizer_class(**init_kwargs)


def _added_token_type() -> type:
    try:
        from tokenizers import AddedToken
    except ImportError:
        raise ImportError(TOKENIZERS_MISSING) from None
    return AddedToken


def _serialise_added_tokens(obj: Any) -> Any:
    """AddedToken -> its dict with "__type": "AddedToken" (how upstream writes tokenizer_config.json), anywhere in
    nested lists and dicts."""
    if isinstance(obj, _added_token_type()):
        return {**obj.__getstate__(), "__type": "AddedToken"}
    return _map_children(obj, _serialise_added_tokens)


def _deserialise_added_tokens(obj: Any) -> Any:
    """The inverse of `_serialise_added_tokens`."""
    if isinstance(obj, dict) and obj.get("__type") == "AddedToken":
        return _added_token_type()(**{k: v for k, v in obj.items() if k != "__type"})
    return _map_children(obj, _deserialise_added_tokens)


def _map_children(obj: Any, convert: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return [convert(o) for o in obj]
    if isinstance(obj, dict):
        return {k: convert(v) for k, v in obj.items()}
    return obj


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise OSError(f"{path!r} is not valid JSON: {err}") from err


def read_tokenizer_files(path: str, kwargs: dict[str, Any], named_tokens: list[str]) -> dict[str, Any]:
    """The init kwargs of a tokenizer directory, as upstream's `_from_pretrained` builds them: tokenizer_config.json
    (minus add_bos/eos_token, which tokenizer.json's post-processor decides), chat_template.jinja files, `kwargs` on
    top, and the added tokens (from tokenizer_config.json, else special_tokens_map.json, added_tokens.json and
    tokenizer.json's added_tokens)."""
    if not os.path.isdir(path):
        raise OSError(f"{path!r} is not a directory: expected a tokenizer dir with {TOKENIZER_FILE}")
    config_file = os.path.join(path, TOKENIZER_CONFIG_FILE)
    config = _read_json(config_file) if os.path.isfile(config_file) else {}
    config.pop("tokenizer_class", None)
    config.pop(
        "init_inputs", None
    )  # positional args of slow tokenizers (vocab file names); not used by tokenizer.json
    tokenizer_file = os.path.join(path, _versioned_tokenizer_file(config.get("fast_tokenizer_files")))
    if not os.path.isfile(tokenizer_file):
        present = sorted(os.listdir(path))
        raise OSError(
            f"No {TOKENIZER_FILE} in {path!r} (found {present}): transformers_static reads tokenizers-library files "
            "only (not vocab.json/merges.txt or a SentencePiece tokenizer.model alone)"
        )
    _refuse_fix_mistral_regex(config, config_file)
    config.pop("add_bos_token", None)
    config.pop("add_eos_token", None)
    templates = _read_chat_templates(path)
    if templates:
        config["chat_template"] = templates["default"] if list(templates) == ["default"] else templates
    config.update(kwargs)
    if "additional_special_tokens" in config and not config.get("extra_special_tokens"):
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    added_token = _added_token_type()
    model_specific = {
        key: config.pop(key)
        for key in list(config)
        if key not in named_tokens and key.endswith("_token") and isinstance(config[key], (str, added_token))
    }
    if isinstance(config.get("extra_special_tokens"), dict):
        model_specific.update(config.pop("extra_special_tokens"))
    if model_specific:
        config["model_specific_special_tokens"] = model_specific
    if "added_tokens_decoder" in config:
        decoder = {
            int(i): t if isinstance(t, added_token) else added_token(**t)
            for i, t in config["added_tokens_decoder"].items()
        }
    else:
        decoder = _legacy_added_tokens(path, config, kwargs, tokenizer_file, named_tokens)
    config["added_tokens_decoder"] = decoder
    config = _deserialise_added_tokens(config)
    by_content = {str(t): t for t in decoder.values()}
    for key in named_tokens:
        if config.get(key) is not None and by_content:
            config[key] = by_content.get(str(config[key]), config[key])
    config["tokenizer_file"] = tokenizer_file
    return config


def _versioned_tokenizer_file(files: list[str] | None) -> str:
    """Upstream's `fast_tokenizer_files` choice: the newest `tokenizer.<version>.json` not newer than 5.23.0."""
    best, best_version = TOKENIZER_FILE, (0,)
    for name in files or []:
        match = re.search(r"tokenizer\.(.*)\.json$", name)
        if match:
            version = tuple(int(p) for p in re.findall(r"\d+", match.group(1)))
            if best_version < version <= UPSTREAM_VERSION:
                best, best_version = name, version
    return best


def _read_chat_templates(path: str) -> dict[str, str]:
    templates = {}
    default = os.path.join(path, CHAT_TEMPLATE_FILE)
    if os.path.isfile(default):
        with open(default, encoding="utf-8") as f:
            templates["default"] = f.read()
    extra_dir = os.path.join(path, CHAT_TEMPLATE_DIR)
    for name in sorted(os.listdir(extra_dir)) if os.path.isdir(extra_dir) else []:
        if name.endswith(".jinja"):
            with open(os.path.join(extra_dir, name), encoding="utf-8") as f:
                templates[name.removesuffix(".jinja")] = f.read()
    return templates


def _legacy_added_tokens(
    path: str, config: dict[str, Any], kwargs: dict[str, Any], tokenizer_file: str, named_tokens: list[str]
) -> dict[int, Any]:
    """Added tokens for a tokenizer_config.json without `added_tokens_decoder`: special_tokens_map.json is merged
    into `config` (in place), then added_tokens.json and tokenizer.json's added_tokens are read."""
    added_token = _added_token_type()
    map_file = os.path.join(path, SPECIAL_TOKENS_MAP_FILE)
    for key, value in (_read_json(map_file) if os.path.isfile(map_file) else {}).items():
        if kwargs.get(key):
            continue
        if isinstance(value, dict) and key != "extra_special_tokens":
            value = added_token(**{k: v for k, v in value.items() if k != "special"}, special=True)
        elif key == "extra_special_tokens" and isinstance(value, list):
            existing = list(config.get("extra_special_tokens") or [])
            for token in value:
                token = added_token(**token, special=True) if isinstance(token, dict) else token
                if token not in existing:
                    existing.append(token)
            value = existing
        config[key] = value
    if isinstance(config.get("extra_special_tokens"), dict):
        config.setdefault("model_specific_special_tokens", {}).update(config.pop("extra_special_tokens"))
    decoder = {}
    added_file = os.path.join(path, ADDED_TOKENS_FILE)
    if os.path.isfile(added_file):
        special = {str(config[k]) for k in named_tokens if config.get(k)}
        special.update(str(t) for t in config.get("extra_special_tokens") or [])
        for content, index in _read_json(added_file).items():
            is_special = content in special
            decoder[index] = added_token(
                content, rstrip=False, lstrip=False, normalized=not is_special, special=is_special
            )
    for token in _read_json(tokenizer_file).get("added_tokens", []):
        index = token["id"]
        decoder[index] = added_token(**{k: v for k, v in token.items() if k != "id"})
    return decoder
