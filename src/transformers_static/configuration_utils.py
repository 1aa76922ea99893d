"""PretrainedConfig: the config.json of a checkpoint, read and written as upstream transformers does."""

from __future__ import annotations

import copy
import json
import os
from typing import Any, ClassVar

import torch

from .utils.hub import refuse_unsupported_hub_arguments, resolve_pretrained_path

CONFIG_NAME = "config.json"

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """`"float16"`, `"torch.float16"` or `torch.float16` -> `torch.float16`; `None` and `"auto"` stay `None`."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name == "auto":
        return None
    if name not in _DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]


class PretrainedConfig:
    """Base configuration. Subclasses set `model_type` and declare their fields in `__init__`.

    Unknown keys in a config.json are kept as attributes (as upstream does) so a round trip loses nothing.
    `attribute_map` aliases upstream's generic names (`hidden_size`) to a model's own (`n_embd`).
    """

    model_type: ClassVar[str] = ""
    attribute_map: ClassVar[dict[str, str]] = {}
    # Tensor parallelism (integrations/tensor_parallel.py): each architecture's plan, {module of the base model:
    # style}; and this process's rank of `_tp_size`, set on the config of a model loaded with `tp_plan` (private:
    # never written to config.json).
    base_model_tp_plan: ClassVar[dict[str, str] | None] = None
    _tp_rank: int = 0
    _tp_size: int = 1

    def __init__(
        self,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        dtype: str | torch.dtype | None = None,
        architectures: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.tie_word_embeddings = tie_word_embeddings
        self.use_cache = use_cache
        # Older checkpoints spell it `torch_dtype`.
        self.dtype = resolve_dtype(dtype if dtype is not None else kwargs.pop("torch_dtype", None))
        self.architectures = architectures
        self._attn_implementation = kwargs.pop("attn_implementation", None) or "sdpa"
        kwargs.pop("transformers_version", None)
        kwargs.pop("model_type", None)
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(self.attribute_map.get(key, key), value)

    def __getattr__(self, key: str) -> Any:
        # Only called when normal lookup fails: resolve upstream's generic aliases.
        attribute_map = type(self).attribute_map
        if key in attribute_map:
            return getattr(self, attribute_map[key])
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r}")

    def tp_heads(self, num_heads: int) -> range:
        """The heads (of `num_heads`) this process computes: all of them in one process; under tensor parallelism its
        contiguous `num_heads / tp_size` share, or, with fewer heads than ranks (key/value heads), the one head its
        query heads read, replicated on `tp_size / num_heads` ranks. Divisibility is checked when the model loads."""
        if num_heads >= self._tp_size:
            share = num_heads // self._tp_size
            return range(self._tp_rank * share, (self._tp_rank + 1) * share)
        head = self._tp_rank * num_heads // self._tp_size
        return range(head, head + 1)

    def __repr__(self) -> str:
        return f"{type(self).__name__} {self.to_json_string()}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PretrainedConfig) and self.to_dict() == other.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-serialisable fields, as written to config.json."""
        out = {k: copy.deepcopy(v) for k, v in self.__dict__.items() if not k.startswith("_")}
        out["dtype"] = None if self.dtype is None else str(self.dtype).removeprefix("torch.")
        out["model_type"] = self.model_type
        out["transformers_version"] = "5.23.0"
        return dict(sorted(out.items()))

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, CONFIG_NAME), "w", encoding="utf-8") as f:
            f.write(self.to_json_string())

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **overrides: Any) -> PretrainedConfig:
        model_type = config_dict.get("model_type")
        if cls.model_type and model_type and model_type != cls.model_type:
            raise ValueError(f"{cls.__name__} expects model_type={cls.model_type!r}, the config has {model_type!r}")
        return cls(**{**config_dict, **overrides})

    @classmethod
    def from_pretrained(
        cls,
        pretrained_path: str | os.PathLike,
        gguf_file: str | None = None,
        *,
        revision: str | None = None,
        local_files_only: bool = False,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        **overrides: Any,
    ) -> PretrainedConfig:
        """Read `config.json` from a checkpoint directory (or the path of a json file) or Hub id (`revision`,
        `local_files_only`, `cache_dir`, `token`: see `utils.hub.resolve_pretrained_path`), or the metadata of
        `gguf_file` in it; `overrides` set config fields."""
        refuse_unsupported_hub_arguments(f"{cls.__name__}.from_pretrained", overrides)
        hub = {"revision": revision, "local_files_only": local_files_only, "cache_dir": cache_dir, "token": token}
        return cls.from_dict(load_config_dict(pretrained_path, gguf_file, **hub), **overrides)


def load_config_dict(
    pretrained_path: str | os.PathLike,
    gguf_file: str | None = None,
    *,
    revision: str | None = None,
    local_files_only: bool = False,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
) -> dict[str, Any]:
    """The raw dict of a checkpoint's config.json (or rebuilt from `gguf_file`'s metadata), with clear errors for a
    missing or corrupt file. A Hub id fetches no weights (`gguf_file` only when given)."""
    path = resolve_pretrained_path(
        pretrained_path,
        revision=revision,
        local_files_only=local_files_only,
        cache_dir=cache_dir,
        token=token,
        weights=False,
        gguf_file=gguf_file,
    )
    if gguf_file is not None:
        from .modeling_gguf_pytorch_utils import load_gguf_config_dict

        return load_gguf_config_dict(os.path.join(path, gguf_file))
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(path):
        raise OSError(f"No {CONFIG_NAME} found at {path!r}: expected a checkpoint directory holding one")
    try:
        with open(path, encoding="utf-8") as f:
            config_dict = json.load(f)
    except json.JSONDecodeError as err:
        raise OSError(f"{path!r} is not valid JSON: {err}") from err
    if not isinstance(config_dict, dict):
        raise OSError(f"{path!r} must hold a JSON object, got {type(config_dict).__name__}")
    return config_dict
