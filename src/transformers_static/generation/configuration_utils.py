"""GenerationConfig: every field of upstream's (transformers 5.23), generation_config.json read and written as upstream
does, the layering `generate` applies, its length rules, and the static path's bucket sizes.

A field left at None is unset: `generate` takes it from the model's config, then from `DEFAULTS`, as upstream does;
`save_pretrained` writes only the fields that are set (or that the file it was read from had). docs/GENERATION.md
lists every field with what `generate` does with it: honoured, refused (NotImplementedError), or not applicable.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

logger = logging.getLogger(__name__)

GENERATION_CONFIG_NAME = "generation_config.json"
# Keys upstream writes about the file itself: kept for the round trip, never warned about.
METADATA_KEYS = ("transformers_version", "_from_model_config")
# Upstream's static cache kinds (sliding windows included) all run on this library's static path.
STATIC_CACHE_IMPLEMENTATIONS = ("static", "sliding_window", "hybrid", "hybrid_chunked")
CACHE_IMPLEMENTATIONS = (*STATIC_CACHE_IMPLEMENTATIONS, "dynamic")
DEFAULT_PREFILL_CHUNK_SIZE = 32
DEFAULT_CACHE_BUCKET_SIZE = 256

# What generate takes for a field set by neither the call, the config passed, nor the model's generation config
# (upstream's `GenerationConfig._get_default_generation_params`, for the fields read here).
DEFAULTS: dict[str, Any] = {
    "max_length": 20,
    "min_length": 0,
    "do_sample": False,
    "use_cache": True,
    "num_beams": 1,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "num_return_sequences": 1,
    "output_scores": False,
    "output_logits": False,
    "return_dict_in_generate": False,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "cache_implementation": "static",
}


def _set(value: Any) -> bool:
    return value is not None


# field -> (true for a (non-None) value that asks for what generate does not do, what that is). `penalty_alpha` (contrastive
# search) depends on other fields and is checked in `GenerationConfig.unsupported`.
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "use_mtp": (bool, "multi-token prediction"),
    "assistant_early_exit": (_set, "early-exit assisted decoding"),
    "is_assistant": (bool, "decoding as an assistant model"),
    "dola_layers": (_set, "DoLa decoding"),
    "constraints": (_set, "constrained beam search"),
    "force_words_ids": (_set, "constrained beam search"),
    "guidance_scale": (lambda v: v != 1, "classifier-free guidance"),
    "watermarking_config": (_set, "watermarking"),
    "token_healing": (bool, "token healing"),
    "output_attentions": (bool, "returning attention weights"),
    "output_hidden_states": (bool, "returning hidden states"),
    "cache_implementation": (lambda v: v not in CACHE_IMPLEMENTATIONS, f"a cache other than {CACHE_IMPLEMENTATIONS}"),
    "compile_config": (_set, "upstream's CompileConfig (use generate(compile=True))"),
    "continuous_batching_config": (_set, "continuous batching"),
}

# Fields that beam search (num_beams > 1) does not combine with here, and what they ask for.
BEAM_REFUSED = {
    "do_sample": "beam sampling",
    "stop_strings": "stop strings in beam search",
    "max_time": "a time limit in beam search",
    "low_memory": "sequential beam search (upstream refuses it too)",
}

# Sampling-only fields and the value at which upstream does not warn about them under greedy decoding (None: any
# value set is warned about).
SAMPLING_FLAGS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": None,
    "top_h": None,
    "typical_p": 1.0,
    "top_k": 50,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
}

_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Log `message` as a warning the first time only."""
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


@dataclass
class GenerationConfig:
    """How `generate` decodes: upstream's fields (None = unset), plus `cache_bucket_size`.

    Static-path buckets: the prompt is left-padded to a multiple of `prefill_chunk_size` (32 when unset) and
    prefilled in chunks of that size (one prefill graph for every prompt length); the cache capacity is rounded up to
    a multiple of `cache_bucket_size` (256 when unset): one decode graph for every `max_new_tokens` that fits.
    Keys of a generation_config.json this class does not know are kept in `extra` and written back.
    """

    # length
    max_length: int | None = None
    max_new_tokens: int | None = None
    min_length: int | None = None
    min_new_tokens: int | None = None
    early_stopping: bool | str | None = None
    max_time: float | None = None
    stop_strings: str | list[str] | None = None
    # strategy
    do_sample: bool | None = None
    num_beams: int | None = None
    use_mtp: bool | None = None
    # cache
    use_cache: bool | None = None
    cache_implementation: str | None = None
    cache_config: dict | None = None
    max_cache_len: int | None = None
    # logits
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    top_h: float | None = None
    typical_p: float | None = None
    epsilon_cutoff: float | None = None
    eta_cutoff: float | None = None
    repetition_penalty: float | None = None
    encoder_repetition_penalty: float | None = None
    length_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    bad_words_ids: list[list[int]] | None = None
    renormalize_logits: bool | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | list[int] | None = None
    remove_invalid_values: bool | None = None
    exponential_decay_length_penalty: tuple[int, float] | list | None = None
    suppress_tokens: list[int] | None = None
    begin_suppress_tokens: list[int] | None = None
    sequence_bias: list | dict | None = None
    token_healing: bool | None = None
    guidance_scale: float | None = None
    watermarking_config: Any = None
    # outputs
    num_return_sequences: int | None = None
    output_attentions: bool | None = None
    output_hidden_states: bool | None = None
    output_scores: bool | None = None
    output_logits: bool | None = None
    return_dict_in_generate: bool | None = None
    # special tokens
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # encoder-decoder (a decoder-only model's "encoder input" is its prompt, as upstream)
    encoder_no_repeat_ngram_size: int | None = None
    decoder_start_token_id: int | list[int] | None = None
    # assisted decoding
    is_assistant: bool | None = None
    num_assistant_tokens: int | None = None
    num_assistant_tokens_schedule: str | None = None
    assistant_confidence_threshold: float | None = None
    prompt_lookup_num_tokens: int | None = None
    max_matching_ngram_size: int | None = None
    assistant_early_exit: int | None = None
    assistant_lookbehind: int | None = None
    target_lookbehind: int | None = None
    assistant_ensemble_weight: float | None = None
    speculation_type: str | None = None
    # performance
    compile_config: Any = None
    disable_compile: bool | None = None
    continuous_batching_config: Any = None
    prefill_chunk_size: int | None = None
    # upstream: deprecated, moved to the Hub
    low_memory: bool | None = None
    penalty_alpha: float | None = None
    dola_layers: str | list[int] | None = None
    diversity_penalty: float | None = None
    num_beam_groups: int | None = None
    constraints: list | None = None
    force_words_ids: list | None = None
    # this library's
    cache_bucket_size: int | None = None
    # keys this class does not know (and upstream's metadata), kept for the round trip
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._file_keys: frozenset[str] = frozenset()
        self.validate()

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls)) - {"extra"}

    def validate(self) -> None:
        """A ValueError for a value no decoding can use (ranges, sizes)."""
        if self.cache_implementation is not None and not isinstance(self.cache_implementation, str):
            raise ValueError(f"cache_implementation must be a string, got {self.cache_implementation!r}")
        for name in ("prefill_chunk_size", "cache_bucket_size", "max_length", "max_new_tokens", "max_cache_len"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("min_length", "min_new_tokens", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.do_sample and self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if self.early_stopping not in (None, True, False, "never"):
            raise ValueError(f"`early_stopping` must be a boolean or 'never', but is {self.early_stopping}.")
        if self.num_beams is not None and self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("min_p", "top_h", "typical_p"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("repetition_penalty", "encoder_repetition_penalty"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def unsupported(self) -> list[str]:
        """`field=value (what it asks for)` for each value asking for something `generate` does not do."""
        found = [
            f"{name}={getattr(self, name)!r} ({what})"
            for name, (asks, what) in REFUSED.items()
            if getattr(self, name) is not None and asks(getattr(self, name))
        ]
        top_k = DEFAULTS["top_k"] if self.top_k is None else self.top_k
        if self.num_beams is not None and self.num_beams > 1:
            found += [
                f"{name}={getattr(self, name)!r} (with num_beams={self.num_beams}: {what})"
                for name, what in BEAM_REFUSED.items()
                if getattr(self, name) not in (None, False)
            ]
            if self.num_beam_groups is not None and self.num_beam_groups > 1:
                found.append(f"num_beam_groups={self.num_beam_groups!r} (group beam search)")
        if self.penalty_alpha is not None and self.penalty_alpha > 0 and self.do_sample is not True and top_k > 1:
            found.append(f"penalty_alpha={self.penalty_alpha!r} (contrastive search)")
        return found

    def ignored_flags(self, user_set: set[str]) -> list[str]:
        """The fields upstream's `GenerationConfig.validate` names as "not valid and may be ignored" for this
        config: sampling-only values without `do_sample`, beam-only values with one beam, cache fields with
        `use_cache=False`, extra outputs without `return_dict_in_generate`, a negative pad id. As upstream, a
        sampling (beam) flag is not named when `do_sample` (`num_beams`) was set by the caller and it was not."""

        def named(outer: str, inner: str) -> bool:
            return inner in user_set or outer not in user_set

        found = []
        if self.pad_token_id is not None and self.pad_token_id < 0:
            found.append("pad_token_id")
        if self.do_sample is not True:
            for name, neutral in SAMPLING_FLAGS.items():
                value = getattr(self, name)
                if value is not None and value != neutral and named("do_sample", name):
                    found.append(name)
        if self.num_beams is None or self.num_beams == 1:
            for name, neutral in (("early_stopping", False), ("length_penalty", 1.0)):
                value = getattr(self, name)
                if value is not None and value != neutral and named("num_beams", name):
                    found.append(name)
        if self.use_cache is False:
            found += [name for name in ("cache_implementation", "cache_config") if getattr(self, name) is not None]
        if self.return_dict_in_generate is not True:
            found += [name for name in ("output_scores", "output_logits") if getattr(self, name) is True]
        return found

    def check_supported(self) -> None:
        """Upstream's ValueErrors on how many sequences a call returns; then NotImplementedError naming every field
        whose value asks for something `generate` does not do."""
        beams, returned = self.num_beams or 1, self.num_return_sequences or 1
        if returned > 1 and beams == 1 and not self.do_sample:
            raise ValueError(
                "Greedy methods (do_sample != True) without beam search do not support `num_return_sequences` "
                f"different than 1 (got {returned})."
            )
        if beams > 1 and returned > beams:
            raise ValueError(
                f"`num_return_sequences` ({returned}) has to be smaller or equal to `num_beams` ({beams})."
            )
        if found := self.unsupported():
            raise NotImplementedError(f"generate does not support {'; '.join(found)}")

    # ------------------------------------------------------------------ layering
    def update(self, **kwargs: Any) -> GenerationConfig:
        """A copy with `kwargs` applied; an unknown name is an error (a typo would otherwise be ignored)."""
        known = self.field_names()
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"Unknown generation argument(s) {unknown}; expected some of {sorted(known)}")
        new = copy.copy(self)
        for key, value in kwargs.items():
            setattr(new, key, value)
        new.validate()
        return new

    def merged(self, fallback: GenerationConfig) -> GenerationConfig:
        """A copy with every unset field (and extra key) taken from `fallback`."""
        new = copy.copy(self)
        for name in self.field_names():
            if getattr(new, name) is None:
                setattr(new, name, getattr(fallback, name))
        new.extra = {**fallback.extra, **self.extra}
        return new

    def with_defaults(self) -> GenerationConfig:
        """A copy with `DEFAULTS` for every unset field."""
        return self.merged(GenerationConfig(**DEFAULTS))

    @classmethod
    def from_any(cls, config: GenerationConfig | Mapping[str, Any] | Any) -> GenerationConfig:
        """Ours as is; a dict as a generation_config.json's; upstream's `transformers.GenerationConfig` (or anything
        with a `to_dict()`) from its set (non-None) values."""
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping):
            return cls.from_dict(config)
        to_dict = getattr(config, "to_dict", None)
        if not callable(to_dict):
            raise TypeError(
                "generation_config must be a GenerationConfig (this library's or upstream's) or a dict, "
                f"got {type(config).__name__}"
            )
        return cls.from_dict({k: v for k, v in to_dict().items() if v is not None and not k.startswith("_")})

    @classmethod
    def from_model_config(cls, model_config: Any) -> GenerationConfig:
        """The generation fields a model config holds (bos/eos/pad ids, ...), as upstream derives a model's generation
        config when its checkpoint has no generation_config.json."""
        values = {k: v for k, v in model_config.to_dict().items() if k in cls.field_names() and v is not None}
        return cls.from_dict({**values, "_from_model_config": True})

    # ------------------------------------------------------------------ files
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GenerationConfig:
        """From a generation_config.json's dict: known fields set (nulls included, and written back as nulls),
        unknown keys kept in `extra` (and warned about once per key)."""
        known = cls.field_names()
        for key in sorted(set(data) - known - set(METADATA_KEYS)):
            warn_once(f"Unknown generation config key {key!r}: kept (written back on save), not used by generate")
        config = cls(
            **{k: v for k, v in data.items() if k in known}, extra={k: v for k, v in data.items() if k not in known}
        )
        config._file_keys = frozenset(k for k in data if k in known)
        return config

    def to_dict(self) -> dict[str, Any]:
        """What `save_pretrained` writes: the fields that are set (or were in the file read), then `extra`."""
        out = {
            name: copy.deepcopy(getattr(self, name))
            for name in sorted(self.field_names())
            if getattr(self, name) is not None or name in self._file_keys
        }
        return {**out, **copy.deepcopy(self.extra)}

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        os.makedirs(save_directory, exist_ok=True)
        data = {k: v for k, v in self.to_dict().items() if k != "compile_config"}  # upstream never writes it either
        with open(os.path.join(save_directory, GENERATION_CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=_to_json)
            f.write("\n")

    @classmethod
    def from_pretrained(cls, pretrained_path: str | os.PathLike) -> GenerationConfig:
        """Read generation_config.json from a checkpoint directory; warns about values `generate` would refuse."""
        path = os.path.join(os.fspath(pretrained_path), GENERATION_CONFIG_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise OSError(f"Could not read {path!r}: {err}") from err
        if not isinstance(data, dict):
            raise OSError(f"{path!r} must hold a JSON object, got {type(data).__name__}")
        config = cls.from_dict(data)
        if refused := config.unsupported():
            logger.warning(
                "%s sets %s: generate will refuse it unless the call overrides it", path, "; ".join(refused)
            )
        return config

    # ------------------------------------------------------------------ the static path
    @property
    def prefill_chunk(self) -> int:
        """The static path's prefill chunk: `prefill_chunk_size`, 32 when unset."""
        return self.prefill_chunk_size or DEFAULT_PREFILL_CHUNK_SIZE

    def padded_prompt_len(self, prompt_len: int) -> int:
        """The static path's prompt length: left-padded to whole prefill chunks."""
        return math.ceil(prompt_len / self.prefill_chunk) * self.prefill_chunk

    def static_cache_len(self, prompt_len: int, max_new_tokens: int) -> int:
        """The StaticCache capacity `generate` allocates: the padded prompt plus `max_new_tokens` (at least
        `max_cache_len`), rounded up to a multiple of `cache_bucket_size`."""
        bucket = self.cache_bucket_size or DEFAULT_CACHE_BUCKET_SIZE
        needed = max(self.padded_prompt_len(prompt_len) + max_new_tokens, self.max_cache_len or 0)
        return math.ceil(needed / bucket) * bucket

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _to_json(value: Any) -> Any:
    """Objects upstream allows in a config (a watermarking config) are written through their `to_dict`."""
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


@dataclass(frozen=True)
class GenerationLengths:
    """How many tokens one call makes, from upstream's rules (`_prepare_generated_length`)."""

    max_new_tokens: int
    min_new_tokens: int  # EOS is suppressed until this many new tokens (min_length / min_new_tokens)
    max_length: int  # prompt width + max_new_tokens


def generation_lengths(
    config: GenerationConfig,
    prompt_width: int,
    *,
    default_max_length: bool,
    default_min_length: bool,
    max_position_embeddings: int | None,
) -> GenerationLengths:
    """Upstream's length rules for a config with defaults applied: `max_new_tokens` wins over `max_length` (a total
    length); with neither set, 20 new tokens (capped by `max_position_embeddings`). Warnings as upstream's."""
    max_length = DEFAULTS["max_length"] if config.max_length is None else config.max_length
    if config.max_new_tokens is not None:
        if not default_max_length:
            logger.warning(
                "Both `max_new_tokens` (=%d) and `max_length`(=%d) seem to have been set. `max_new_tokens` will take "
                "precedence.",
                config.max_new_tokens,
                config.max_length,
            )
        max_length = config.max_new_tokens + prompt_width
    elif default_max_length:
        max_length += prompt_width
        if max_position_embeddings is not None:
            max_length = min(max_length, max_position_embeddings)
        warnings.warn(
            f"Using the model-agnostic default `max_length` (={max_length}) to control the generation length. We "
            "recommend setting `max_new_tokens` to control the maximum length of the generation.",
            UserWarning,
            stacklevel=3,
        )
    if prompt_width >= max_length:
        raise ValueError(
            f"Input length of input_ids is {prompt_width}, but `max_length` is set to {max_length}. Increase "
            "`max_length` or, better, set `max_new_tokens`."
        )
    min_length = config.min_length or 0
    if config.min_new_tokens is not None:
        if not default_min_length:
            logger.warning(
                "Both `min_new_tokens` (=%d) and `min_length`(=%d) seem to have been set. `min_new_tokens` will take "
                "precedence.",
                config.min_new_tokens,
                config.min_length,
            )
        min_length = config.min_new_tokens + prompt_width
    if min_length > max_length:
        warnings.warn(
            f"Unfeasible length constraints: the minimum length ({min_length}) is larger than the maximum possible "
            f"length ({max_length}). Generation will stop at the defined maximum length.",
            UserWarning,
            stacklevel=3,
        )
    return GenerationLengths(max_length - prompt_width, max(min_length - prompt_width, 0), max_length)
