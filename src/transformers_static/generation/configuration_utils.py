"""GenerationConfig: upstream's generation fields, plus the static path's bucket sizes."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

GENERATION_CONFIG_NAME = "generation_config.json"
CACHE_IMPLEMENTATIONS = ("static", "dynamic")
DEFAULT_MAX_NEW_TOKENS = 20  # upstream's default when neither max_new_tokens nor max_length is set


@dataclass
class GenerationConfig:
    """How `generate` decodes. Unknown keys in a generation_config.json are ignored.

    Static-path buckets: the prompt is left-padded to a multiple of `prefill_chunk_size` and prefilled in chunks of
    that size (one prefill graph for every prompt length); the cache capacity is rounded up to a multiple of
    `cache_bucket_size` (one decode graph for every `max_new_tokens` that fits the bucket).
    """

    max_new_tokens: int | None = None
    max_length: int | None = None  # prompt + new tokens; with neither set, DEFAULT_MAX_NEW_TOKENS new tokens
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float = 1.0
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    cache_implementation: str = "static"
    return_dict_in_generate: bool = False
    output_logits: bool = False
    prefill_chunk_size: int = 32
    cache_bucket_size: int = 256

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(
                f"cache_implementation must be one of {CACHE_IMPLEMENTATIONS}, got {self.cache_implementation!r}"
            )
        for name in ("prefill_chunk_size", "cache_bucket_size", "max_length"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.do_sample and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def new_tokens(self, prompt_len: int, max_positions: int | None) -> int:
        """How many tokens to generate, as upstream decides: `max_new_tokens`, else `max_length` less the prompt,
        else DEFAULT_MAX_NEW_TOKENS, kept within `max_positions` (the config's max_position_embeddings)."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        if self.max_length is not None:
            return max(self.max_length - prompt_len, 1)
        room = DEFAULT_MAX_NEW_TOKENS if max_positions is None else max_positions - prompt_len
        return max(min(DEFAULT_MAX_NEW_TOKENS, room), 1)

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def update(self, **kwargs: Any) -> GenerationConfig:
        """A copy with `kwargs` applied; an unknown name is an error (a typo would otherwise be ignored)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"Unknown generation argument(s) {unknown}; expected some of {sorted(known)}")
        new = copy.copy(self)
        for key, value in kwargs.items():
            setattr(new, key, value)
        new.validate()
        return new

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, GENERATION_CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)

    @classmethod
    def from_pretrained(cls, pretrained_path: str | os.PathLike) -> GenerationConfig:
        """Read generation_config.json from a checkpoint directory (nulls and unknown keys keep our defaults)."""
        path = os.path.join(os.fspath(pretrained_path), GENERATION_CONFIG_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise OSError(f"Could not read {path!r}: {err}") from err
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and v is not None})
