"""What every tokenizer shares, as upstream's `tokenization_utils_base`: `BatchEncoding`, the padding and truncation
strategies, special-token attributes, `pad`, `decode`, `apply_chat_template`, `from_pretrained` / `save_pretrained`
(the files themselves are read and written by `tokenization_files`)."""

from __future__ import annotations

import copy
import enum
import json
import logging
import os
from collections import UserDict
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from .tokenization_chat_template import ChatTemplateMixin
from .tokenization_files import (
    ADDED_TOKENS_FILE,
    CHAT_TEMPLATE_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    _added_token_type,
    _serialise_added_tokens,
    load_tokenizer,
)

# Upstream's public names of this module (the file names live in tokenization_files).
__all__ = [
    "ADDED_TOKENS_FILE",
    "CHAT_TEMPLATE_FILE",
    "SPECIAL_TOKENS_MAP_FILE",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "BatchEncoding",
    "PaddingStrategy",
    "PreTrainedTokenizerBase",
    "TruncationStrategy",
]

logger = logging.getLogger(__name__)

VERY_LARGE_INTEGER = int(1e30)  # model_max_length of a model with no length limit
LARGE_INTEGER = int(1e20)


class PaddingStrategy(enum.Enum):
    LONGEST = "longest"
    MAX_LENGTH = "max_length"
    DO_NOT_PAD = "do_not_pad"


class TruncationStrategy(enum.Enum):
    ONLY_FIRST = "only_first"
    ONLY_SECOND = "only_second"
    LONGEST_FIRST = "longest_first"
    DO_NOT_TRUNCATE = "do_not_truncate"


def _strategy(enum_cls: type[enum.Enum], value: Any, when_true: enum.Enum, when_off: enum.Enum) -> Any:
    """`True` -> `when_true`, `False` / `None` -> `when_off`, a name or member -> the member."""
    if value is True:
        return when_true
    if value is False or value is None:
        return when_off
    try:
        return enum_cls(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not a valid {enum_cls.__name__}, please select one of {[e.value for e in enum_cls]}"
        ) from None


class BatchEncoding(UserDict):
    """The output of a tokenizer call: a dict (`input_ids`, `attention_mask`, ...) with `.to(device)`, and the
    backend's `tokenizers.Encoding` objects (`encodings`, `tokens(i)`, `word_ids(i)`)."""

    def __init__(
        self,
        data: dict[str, Any] | None = None,
        encoding: Any = None,
        tensor_type: str | None = None,
        prepend_batch_axis: bool = False,
    ) -> None:
        super().__init__(data)
        self._encodings = [encoding] if encoding is not None and not isinstance(encoding, list) else encoding
        self.convert_to_tensors(tensor_type, prepend_batch_axis)

    def __getitem__(self, item: str | int | slice) -> Any:
        if isinstance(item, str):
            return self.data[item]
        if self._encodings is not None:
            return self._encodings[item]
        if isinstance(item, slice):
            return {key: value[item] for key, value in self.data.items()}
        raise KeyError("Invalid key: use a string, an int (a backend Encoding) or a slice")

    def __getattr__(self, item: str) -> Any:
        try:
            return self.data[item]
        except KeyError:
            raise AttributeError(item) from None

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self.data, "encodings": self._encodings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.data, self._encodings = state["data"], state["encodings"]

    @property
    def encodings(self) -> list[Any] | None:
        return self._encodings

    @property
    def is_fast(self) -> bool:
        return self._encodings is not None

    def tokens(self, batch_index: int = 0) -> list[str]:
        return self._encodings[batch_index].tokens

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._encodings[batch_index].word_ids

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._encodings[batch_index].sequence_ids

    def convert_to_tensors(self, tensor_type: str | None = None, prepend_batch_axis: bool = False) -> BatchEncoding:
        """Lists -> torch tensors (`"pt"`) or numpy arrays (`"np"`), in place."""
        if tensor_type is None:
            return self
        if tensor_type not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt', 'np' or None, got {tensor_type!r}")
        for key, value in self.items():
            value = [value] if prepend_batch_axis else value
            try:
                self[key] = _as_tensor(value, tensor_type)
            except (ValueError, TypeError) as err:
                raise ValueError(
                    "Unable to create tensor, you should probably activate truncation and/or padding with "
                    f"'padding=True' 'truncation=True' to have batched tensors with the same length (key {key!r})."
                ) from err
        return self

    def to(self, device: str | torch.device | int, *, non_blocking: bool = False) -> BatchEncoding:
        """Move every tensor to `device` (in place; returns self)."""
        if isinstance(device, (str, torch.device, int)):
            self.data = {
                k: v.to(device=device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
                for k, v in self.data.items()
            }
        else:
            logger.warning("Attempting to cast a BatchEncoding to type %s. This is not supported.", device)
        return self


def _as_tensor(value: Any, tensor_type: str) -> Any:
    import numpy as np

    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value if tensor_type == "np" or isinstance(value, torch.Tensor) else torch.from_numpy(value)
    empty = not _flatten(value)
    if tensor_type == "pt":
        return torch.tensor(value, dtype=torch.int64 if empty else None)
    if (
        isinstance(value, (list, tuple))
        and value
        and isinstance(value[0], (list, tuple))
        and len(set(map(len, value))) > 1
    ):
        return np.asarray([np.asarray(v) for v in value], dtype=object)  # ragged rows: an object array, as upstream
    return np.asarray(value, dtype=np.int64 if empty else None)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten(v)]
    return [value]


def to_py_obj(obj: Any) -> Any:
    """Tensors / numpy arrays / nested lists of them -> python lists and ints."""
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if hasattr(obj, "tolist") and type(obj).__module__ == "numpy":
        return obj.tolist()
    if isinstance(obj, (list, tuple)):
        return [to_py_obj(o) for o in obj]
    return obj


class PreTrainedTokenizerBase(ChatTemplateMixin):
    """Special tokens, padding/truncation strategies, `pad`, `decode`, chat templates, saving. The backend
    (tokenizers library) is in `TokenizersBackend`."""

    SPECIAL_TOKENS_ATTRIBUTES: ClassVar[list[str]] = [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ]
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]
    # file fields upstream's class writes to tokenizer_config.json as null (its __init__ passes them on by name)
    saved_as_null: ClassVar[tuple[str, ...]] = ()
    padding_side: str = "right"
    truncation_side: str = "right"

    def _init_base(self, kwargs: dict[str, Any]) -> None:
        """Upstream's `PreTrainedTokenizerBase.__init__`: reads what the base class owns from `kwargs`; the rest
        stays in `init_kwargs` (written back by `save_pretrained`)."""
        if "additional_special_tokens" in kwargs and "extra_special_tokens" not in kwargs:
            kwargs["extra_special_tokens"] = kwargs.pop("additional_special_tokens")
        self.init_kwargs = copy.deepcopy(kwargs)
        self.name_or_path = kwargs.pop("name_or_path", "")
        self.verbose = kwargs.pop("verbose", False)
        self._special_tokens_map = dict.fromkeys(self.SPECIAL_TOKENS_ATTRIBUTES)
        self._extra_special_tokens = []
        model_specific = self._read_special_tokens(kwargs)
        max_length = kwargs.pop("model_max_length", kwargs.pop("max_len", None))
        self.model_max_length = max_length if max_length is not None else VERY_LARGE_INTEGER
        for side in ("padding_side", "truncation_side"):
            setattr(self, side, kwargs.pop(side, getattr(self, side)))
            if getattr(self, side) not in ("right", "left"):
                raise ValueError(f"{side} should be 'right' or 'left', got {getattr(self, side)!r}")
        self.model_input_names = list(kwargs.pop("model_input_names", self.model_input_names))
        self.clean_up_tokenization_spaces = kwargs.pop("clean_up_tokenization_spaces", False)
        self.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = kwargs.pop(
            "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
        )
        self.split_special_tokens = kwargs.pop("split_special_tokens", False)
        chat_template = kwargs.pop("chat_template", None)
        if isinstance(chat_template, (list, tuple)):  # saved as [{"name": ..., "template": ...}]
            chat_template = {t["name"]: t["template"] for t in chat_template}
        self.chat_template = chat_template
        self.response_template = kwargs.pop("response_template", None)
        self.chat_control_tokens = kwargs.pop("chat_control_tokens", None)
        if model_specific:
            self._set_model_specific_special_tokens(model_specific)
        self.backend = kwargs.pop("backend", None)

    def _read_special_tokens(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Named special tokens and extra special tokens out of `kwargs`; returns the model-specific ones
        (`image_token`, ...: any other `*_token` string, plus `model_specific_special_tokens`)."""
        model_specific = {}
        for key in list(kwargs):
            if key in self.SPECIAL_TOKENS_ATTRIBUTES:
                value = kwargs.pop(key)
                if value is not None and not isinstance(value, (str, _added_token_type())):
                    raise TypeError(f"Special token {key} has to be either str or AddedToken but got: {type(value)}")
                if value is not None:
                    self._special_tokens_map[key] = value
            elif key == "extra_special_tokens":
                value = kwargs.pop(key)
                if isinstance(value, dict):
                    model_specific.update(value)
                elif isinstance(value, (list, tuple)):
                    self._extra_special_tokens = list(value)
                elif value is not None:
                    raise TypeError("extra_special_tokens must be a list/tuple of tokens or a dict of named tokens")
            elif key.endswith("_token") and isinstance(kwargs[key], (str, _added_token_type())):
                model_specific[key] = kwargs.pop(key)
        return {**model_specific, **(kwargs.pop("model_specific_special_tokens", None) or {})}

    def _set_model_specific_special_tokens(self, special_tokens: dict[str, Any]) -> None:
        self.SPECIAL_TOKENS_ATTRIBUTES = self.SPECIAL_TOKENS_ATTRIBUTES + list(special_tokens)
        self._special_tokens_map.update(special_tokens)

    # ------------------------------------------------------------------ special tokens as attributes
    def __getattr__(self, key: str) -> Any:
        name = key.removesuffix("_ids").removesuffix("_id") if key.endswith(("_id", "_ids")) else key
        if name in self.__dict__.get("SPECIAL_TOKENS_ATTRIBUTES", type(self).SPECIAL_TOKENS_ATTRIBUTES):
            value = self.__dict__.get("_special_tokens_map", {}).get(name)
            if value is None:
                return None
            return self.convert_tokens_to_ids(str(value)) if key != name else str(value)
        if name == "extra_special_tokens":
            tokens = [str(t) for t in self.__dict__.get("_extra_special_tokens", [])]
            return self.convert_tokens_to_ids(tokens) if key != name else tokens
        raise AttributeError(f"{type(self).__name__} has no attribute {key}")

    def __setattr__(self, key: str, value: Any) -> None:
        name = key.removesuffix("_ids").removesuffix("_id") if key.endswith(("_id", "_ids")) else key
        if name in self.__dict__.get("SPECIAL_TOKENS_ATTRIBUTES", type(self).SPECIAL_TOKENS_ATTRIBUTES):
            if key != name and value is not None:
                value = self.convert_ids_to_tokens(value)
            if value is not None and not isinstance(value, (str, _added_token_type())):
                raise ValueError(f"Cannot set a non-string value as the {name}")
            self._special_tokens_map[name] = value
        elif name == "extra_special_tokens":
            if key != name and isinstance(value, (list, tuple)):
                value = [self.convert_ids_to_tokens(v) for v in value]
            if value is not None and not isinstance(value, (list, tuple)):
                raise ValueError(f"extra_special_tokens must be a list or tuple, got {type(value)}")
            self._extra_special_tokens = [] if value is None else list(value)
        else:
            super().__setattr__(key, value)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set, as strings."""
        return {
            k: str(self._special_tokens_map[k])
            for k in self.SPECIAL_TOKENS_ATTRIBUTES
            if self._special_tokens_map.get(k) is not None
        }

    @property
    def all_special_tokens(self) -> list[str]:
        """Named then extra special tokens, as unique strings."""
        named = [self._special_tokens_map.get(k) for k in self.SPECIAL_TOKENS_ATTRIBUTES]
        tokens = [str(t) for t in named + list(self._extra_special_tokens) if t is not None]
        return list(dict.fromkeys(tokens))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def pad_token_type_id(self) -> int:
        return 0

    def add_special_tokens(
        self, special_tokens_dict: dict[str, Any], replace_extra_special_tokens: bool = True
    ) -> int:
        """Set named special tokens (`{"pad_token": "[PAD]"}`) or `extra_special_tokens`, adding them to the
        vocabulary when new; returns how many tokens were added."""
        added_token = _added_token_type()
        special_tokens_dict = dict(special_tokens_dict)
        if "additional_special_tokens" in special_tokens_dict and not special_tokens_dict.get("extra_special_tokens"):
            special_tokens_dict["extra_special_tokens"] = special_tokens_dict.pop("additional_special_tokens")
        allowed = set(self.SPECIAL_TOKENS_ATTRIBUTES) | {"extra_special_tokens"}
        to_add = []
        for key, value in special_tokens_dict.items():
            if key not in allowed:
                raise ValueError(f"Key {key} is not a valid special token. Valid keys are: {allowed}")
            if key == "extra_special_tokens":
                if not isinstance(value, (list, tuple)) or not all(isinstance(t, (str, added_token)) for t in value):
                    raise ValueError(f"Tokens {value} for key {key} should all be str or AddedToken instances")
                new = [
                    added_token(t, rstrip=False, lstrip=False, normalized=False, special=True)
                    if isinstance(t, str)
                    else t
                    for t in value
                    if replace_extra_special_tokens or str(t) not in self.extra_special_tokens
                ]
                if replace_extra_special_tokens and new:
                    self._extra_special_tokens = list(new)
                else:
                    self._extra_special_tokens.extend(new)
                to_add.extend(new)
            else:
                if not isinstance(value, (str, added_token)):
                    raise ValueError(f"Token {value} for key {key} should be a str or an AddedToken instance")
                if isinstance(value, str):
                    value = added_token(value, rstrip=False, lstrip=False, normalized=False, special=True)
                setattr(self, key, value)
                to_add.append(value)
        return self.add_tokens(to_add, special_tokens=True)

    def add_tokens(self, new_tokens: Any, special_tokens: bool = False) -> int:
        if not new_tokens:
            return 0
        return self._add_tokens(new_tokens if isinstance(new_tokens, (list, tuple)) else [new_tokens], special_tokens)

    # ------------------------------------------------------------------ strategies, encode, pad
    def _get_padding_truncation_strategies(
        self, padding: Any = False, truncation: Any = None, max_length: int | None = None, pad_to_multiple_of=None
    ) -> tuple[PaddingStrategy, TruncationStrategy, int | None]:
        """Upstream's resolution of `padding` / `truncation` / `max_length` into strategies."""
        if max_length is not None and padding is False and truncation is None:
            truncation = "longest_first"
        padding_strategy = _strategy(PaddingStrategy, padding, PaddingStrategy.LONGEST, PaddingStrategy.DO_NOT_PAD)
        truncation_strategy = _strategy(
            TruncationStrategy, truncation, TruncationStrategy.LONGEST_FIRST, TruncationStrategy.DO_NOT_TRUNCATE
        )
        if max_length is None:
            unlimited = self.model_max_length > LARGE_INTEGER
            if padding_strategy == PaddingStrategy.MAX_LENGTH:
                padding_strategy, max_length = (
                    (PaddingStrategy.DO_NOT_PAD, None) if unlimited else (padding_strategy, self.model_max_length)
                )
            if truncation_strategy != TruncationStrategy.DO_NOT_TRUNCATE:
                if unlimited:
                    truncation_strategy = TruncationStrategy.DO_NOT_TRUNCATE
                else:
                    max_length = self.model_max_length
        if padding_strategy != PaddingStrategy.DO_NOT_PAD and (self.pad_token is None or self.pad_token_id < 0):
            raise ValueError(
                "Asking to pad but the tokenizer does not have a padding token. Please select a token to use as "
                "`pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` or add a new pad token via "
                "`tokenizer.add_special_tokens({'pad_token': '[PAD]'})`."
            )
        if (
            truncation_strategy != TruncationStrategy.DO_NOT_TRUNCATE
            and padding_strategy != PaddingStrategy.DO_NOT_PAD
            and pad_to_multiple_of is not None
            and max_length is not None
            and max_length % pad_to_multiple_of != 0
        ):
            raise ValueError(
                f"Truncation and padding are both activated but truncation length ({max_length}) is not a multiple "
                f"of pad_to_multiple_of ({pad_to_multiple_of})."
            )
        return padding_strategy, truncation_strategy, max_length

    def encode(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> list[int] | torch.Tensor:
        """The token ids of `text` (the `input_ids` of `self(text, ...)`)."""
        return self(
            text,
            text_pair=text_pair,
            add_special_tokens=add_special_tokens,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            **kwargs,
        )["input_ids"]

    def pad(
        self,
        encoded_inputs: Mapping[str, Any] | list[Mapping[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | None = None,
    ) -> BatchEncoding:
        """Pad already-encoded inputs (a dict of lists, or a list of dicts) to the longest or to `max_length`."""
        if isinstance(encoded_inputs, (list, tuple)) and encoded_inputs and isinstance(encoded_inputs[0], Mapping):
            encoded_inputs = {key: [example[key] for example in encoded_inputs] for key in encoded_inputs[0]}
        main = self.model_input_names[0]
        if main not in encoded_inputs:
            raise ValueError(
                f"You should supply an encoding or a list of encodings with {main!r}, got {list(encoded_inputs)}"
            )
        values = encoded_inputs[main]
        if values is None or len(values) == 0:
            return BatchEncoding({**encoded_inputs, **({"attention_mask": []} if return_attention_mask else {})})
        if return_tensors is None and isinstance(values[0], torch.Tensor):
            return_tensors = "pt"
        elif return_tensors is None and type(values[0]).__module__ == "numpy":
            return_tensors = "np"
        encoded_inputs = {k: to_py_obj(v) for k, v in encoded_inputs.items()}
        strategy, _, max_length = self._get_padding_truncation_strategies(padding=padding, max_length=max_length)
        batch = encoded_inputs[main]
        if batch and not isinstance(batch[0], (list, tuple)):
            padded = self._pad(
                encoded_inputs, max_length, strategy, pad_to_multiple_of, padding_side, return_attention_mask
            )
            return BatchEncoding(padded, tensor_type=return_tensors)
        if strategy == PaddingStrategy.LONGEST:
            max_length, strategy = max(len(ids) for ids in batch), PaddingStrategy.MAX_LENGTH
        rows = [
            self._pad(
                {k: v[i] for k, v in encoded_inputs.items()},
                max_length,
                strategy,
                pad_to_multiple_of,
                padding_side,
                return_attention_mask,
            )
            for i in range(len(batch))
        ]
        return BatchEncoding(
            {k: [row[k] for row in rows] for k in rows[0]} if rows else {}, tensor_type=return_tensors
        )

    def _pad(
        self,
        inputs: dict[str, Any],
        max_length: int | None,
        strategy: PaddingStrategy,
        pad_to_multiple_of: int | None,
        padding_side: str | None,
        return_attention_mask: bool | None,
    ) -> dict[str, Any]:
        """One example padded on `padding_side` (ids with pad_token_id, mask with 0, special mask with 1)."""
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        ids = inputs[self.model_input_names[0]]
        if strategy == PaddingStrategy.LONGEST:
            max_length = len(ids)
        if max_length is not None and pad_to_multiple_of is not None and max_length % pad_to_multiple_of:
            max_length = (max_length // pad_to_multiple_of + 1) * pad_to_multiple_of
        if return_attention_mask and "attention_mask" not in inputs:
            inputs["attention_mask"] = [1] * len(ids)
        missing = max_length - len(ids) if strategy != PaddingStrategy.DO_NOT_PAD and max_length is not None else 0
        if missing <= 0:
            return inputs
        side = padding_side or self.padding_side
        if side not in ("left", "right"):
            raise ValueError(f"Invalid padding strategy: {side!r}")
        fills = {
            self.model_input_names[0]: self.pad_token_id,
            "attention_mask": 0,
            "token_type_ids": self.pad_token_type_id,
            "special_tokens_mask": 1,
        }
        for key, fill in fills.items():
            if key in inputs and (key != "attention_mask" or return_attention_mask):
                pad = [fill] * missing
                inputs[key] = pad + inputs[key] if side == "left" else inputs[key] + pad
        return inputs

    # ------------------------------------------------------------------ decode
    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str | list[str]:
        """Text of `token_ids` (int, list, tensor); a list of texts for a batch (list of lists, 2D tensor)."""
        token_ids = to_py_obj(token_ids)
        if isinstance(token_ids, list) and token_ids and isinstance(token_ids[0], list):
            return [self._decode(ids, skip_special_tokens=skip_special_tokens, **kwargs) for ids in token_ids]
        return self._decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)

    def batch_decode(
        self,
        sequences: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> list[str]:
        result = self.decode(
            sequences,
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            **kwargs,
        )
        return [result] if isinstance(result, str) else result

    @staticmethod
    def clean_up_tokenization(text: str) -> str:
        """Remove the spaces WordPiece-style decoding leaves before punctuation and contractions."""
        for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't")):
            text = text.replace(before, after)
        for suffix in ("'m", "'s", "'ve", "'re"):
            text = text.replace(" " + suffix, suffix)
        return text

    # ------------------------------------------------------------------ files
    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any
    ) -> PreTrainedTokenizerBase:
        """Load from a directory (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
        chat_template.jinja) or a Hub id (see `load_tokenizer`). kwargs override the files' settings."""
        return load_tokenizer(
            lambda path: cls, pretrained_model_name_or_path, caller=f"{cls.__name__}.from_pretrained", **kwargs
        )

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> tuple[str, ...]:
        """Write tokenizer_config.json, chat_template.jinja (and additional_chat_templates/) and tokenizer.json,
        as upstream 5 writes them."""
        if kwargs:
            raise TypeError(f"save_pretrained got unsupported argument(s) {sorted(kwargs)} (push_to_hub etc.)")
        if os.path.isfile(save_directory):
            raise ValueError(f"Provided path ({save_directory}) should be a directory, not a file")
        os.makedirs(save_directory, exist_ok=True)
        config = copy.deepcopy(self.init_kwargs)
        for key in (*self.init_kwargs, "model_max_length"):
            if key in ("add_bos_token", "add_eos_token"):
                config.pop(key, None)
            elif hasattr(self, key):
                config[key] = getattr(self, key)
        config.update(self.special_tokens_map)
        if self._extra_special_tokens:
            config["extra_special_tokens"] = self.extra_special_tokens
        saved = self._save_chat_templates(os.fspath(save_directory), config)
        for key in ("response_template", "chat_control_tokens"):
            if getattr(self, key, None) is not None:
                config[key] = list(getattr(self, key)) if key == "chat_control_tokens" else getattr(self, key)
        for key in (
            "tokenizer_file",
            "vocab_file",
            "merges_file",
            "name_or_path",
            "special_tokens_map_file",
            "added_tokens_decoder",
            "additional_special_tokens",
            "files_loaded",
            "device_map",
        ):
            config.pop(key, None)
        config.update(dict.fromkeys(self.saved_as_null))
        config["tokenizer_class"] = type(self).__name__
        config_file = os.path.join(save_directory, TOKENIZER_CONFIG_FILE)
        with open(config_file, "w", encoding="utf-8") as f:
            f.write(json.dumps(_serialise_added_tokens(config), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        return (config_file, *saved, self._save_backend(os.fspath(save_directory)))
