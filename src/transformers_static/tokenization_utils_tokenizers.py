"""`TokenizersBackend` (alias `PreTrainedTokenizerFast`): a tokenizer on the `tokenizers` library, built from a
tokenizer.json exactly as upstream transformers 5 builds it, so ids, decoded text and saved files match.

Model-specific classes (`GPT2Tokenizer`, `LlamaTokenizer`, ...) rebuild the pipeline from tokenizer.json's vocab
and merges with their own normalizer / pre-tokenizer / decoder, as upstream's do; `TokenizersBackend` itself uses
tokenizer.json as it is."""

from __future__ import annotations

import copy
import logging
import os
from collections import defaultdict
from typing import Any, ClassVar

from .tokenization_backends import native_parts
from .tokenization_files import TOKENIZERS_MISSING
from .tokenization_utils_base import (
    BatchEncoding,
    PaddingStrategy,
    PreTrainedTokenizerBase,
    TruncationStrategy,
)

try:
    from tokenizers import AddedToken, Tokenizer, processors
except ImportError:  # the [tokenizers] extra
    AddedToken = Tokenizer = processors = None

logger = logging.getLogger(__name__)


class TokenizersBackend(PreTrainedTokenizerBase):
    """A `tokenizers.Tokenizer` with upstream's special tokens, padding, truncation, decoding and chat templates.

    Build it with `from_pretrained(dir)` (or `from_pretrained(dir, gguf_file=...)`), `TokenizersBackend(tokenizer_file=
    path)` or `TokenizersBackend(tokenizer_object=tokenizers.Tokenizer(...))`, a model-specific class also from
    `vocab=` / `merges=`, plus any tokenizer_config.json setting as kwargs.
    """

    # Settings a model-specific class assumes when its files leave them out (the defaults of upstream's `__init__`:
    # special tokens, add_prefix_space, ...).
    init_defaults: ClassVar[dict[str, Any]] = {}
    # The `tokenizers` model a model-specific class rebuilds over tokenizer.json's vocab: "BPE" or "Unigram".
    backend_model: ClassVar[str] = "BPE"

    def __init__(self, *, tokenizer_object: Any = None, tokenizer_file: str | None = None, **kwargs: Any) -> None:
        if Tokenizer is None:
            raise ImportError(TOKENIZERS_MISSING)
        backend = self._make_backend(tokenizer_object, tokenizer_file, kwargs)
        self._tokenizer = backend
        self._apply_backend_settings(kwargs)
        kwargs.setdefault("backend", "tokenizers")
        explicit_bos_eos = "add_bos_token" in kwargs or "add_eos_token" in kwargs
        self._add_bos_token = kwargs.get("add_bos_token", False)
        self._add_eos_token = kwargs.get("add_eos_token", False)
        if post_processor := kwargs.pop("post_processor", None):
            backend.post_processor = post_processor
        update_post_processor = explicit_bos_eos or backend.post_processor is None
        added_tokens_decoder = kwargs.get("added_tokens_decoder", {})
        add_prefix_space = kwargs.get("add_prefix_space", False)
        self._init_base(kwargs)
        self.add_prefix_space = add_prefix_space
        backend.encode_special_tokens = self.split_special_tokens
        self._add_missing_tokens(added_tokens_decoder)
        if update_post_processor or backend.post_processor is None:
            self.update_post_processor()
        self._finish_init()

    # ------------------------------------------------------------------ building the backend
    def _make_backend(self, tokenizer_object: Any, tokenizer_file: str | None, kwargs: dict[str, Any]) -> Any:
        """The class's defaults into `kwargs`, then the backend: `tokenizer_object` as given, tokenizer.json as it is
        (the base class) or the class's own pipeline over its vocab and merges, or over `vocab=` / `merges=`."""
        for key, value in self.init_defaults.items():
            kwargs.setdefault(key, value)
        if tokenizer_object is not None:
            return copy.deepcopy(tokenizer_object)
        own_pipeline = type(self).build_backend is not TokenizersBackend.build_backend
        if tokenizer_file is None and own_pipeline and "vocab" in kwargs:
            return self.build_backend(kwargs)
        if tokenizer_file is None or not os.path.isfile(tokenizer_file):
            vocab = " or vocab= / merges=" if own_pipeline else ""
            raise ValueError(
                f"{type(self).__name__} needs tokenizer_file (a tokenizer.json) or tokenizer_object "
                f"(a tokenizers.Tokenizer){vocab}; got tokenizer_file={tokenizer_file!r}"
            )
        if not own_pipeline:
            return Tokenizer.from_file(tokenizer_file)
        kwargs.update(native_parts(tokenizer_file, self.backend_model))
        return self.build_backend(kwargs)

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        """A model-specific class's own pipeline over `kwargs["vocab"]` / `kwargs["merges"]` (popped, as are the
        options it reads); the base class uses tokenizer.json as it is."""
        raise NotImplementedError

    def _apply_backend_settings(self, kwargs: dict[str, Any]) -> None:
        """tokenizer.json's truncation and padding: kept on the backend, and defaults for the matching settings."""
        backend = self._tokenizer
        truncation = kwargs.pop("tokenizer_truncation", None) or backend.truncation
        if truncation is not None:
            backend.enable_truncation(**truncation)
            kwargs.setdefault("max_length", truncation["max_length"])
            kwargs.setdefault("truncation_side", truncation["direction"])
            kwargs.setdefault("stride", truncation["stride"])
            kwargs.setdefault("truncation_strategy", truncation["strategy"])
        else:
            backend.no_truncation()
        padding = kwargs.pop("tokenizer_padding", None) or backend.padding
        if padding is not None:
            backend.enable_padding(**padding)
            kwargs.setdefault("pad_token", padding["pad_token"])
            kwargs.setdefault("pad_token_type_id", padding["pad_type_id"])
            kwargs.setdefault("padding_side", padding["direction"])
            kwargs.setdefault("max_length", padding["length"])
            kwargs.setdefault("pad_to_multiple_of", padding["pad_to_multiple_of"])

    def _add_missing_tokens(self, added_tokens_decoder: dict[int, Any]) -> None:
        """Re-add the configured added tokens (in id order; tokenizer_config.json's flags win) and add every special
        token the vocabulary lacks as an added token."""
        tokens = [token for _, token in sorted(added_tokens_decoder.items(), key=lambda item: item[0])]
        known = list(self.added_tokens_encoder) + [str(t) for t in tokens]
        for value in [*self._special_tokens_map.values(), *self._extra_special_tokens]:
            if value is not None and str(value) not in known and value not in tokens:
                tokens.append(value)
        named = [str(t) for t in self._special_tokens_map.values() if t]
        for i, token in enumerate(tokens):
            if isinstance(token, str):
                tokens[i] = AddedToken(token, special=True)
            elif not token.special and str(token) in named:
                token.special = True
        self.add_tokens(tokens)

    def _finish_init(self) -> None:
        """What a model-specific class does after the common initialisation."""

    # ------------------------------------------------------------------ special tokens in the post-processor
    def update_post_processor(self) -> None:
        """The post-processor adds bos / eos as `add_bos_token` / `add_eos_token` say."""
        add_bos = self._add_bos_token = self._add_bos_token and self.bos_token is not None
        add_eos = self._add_eos_token = self._add_eos_token and self.eos_token is not None
        bos, eos = self.bos_token, self.eos_token
        single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
        pair = f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1{' ' + eos + ':1' if add_eos else ''}"
        special = [(bos, self.bos_token_id)] * add_bos + [(eos, self.eos_token_id)] * add_eos
        self._tokenizer.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special
        )

    @property
    def add_bos_token(self) -> bool:
        return self._add_bos_token

    @add_bos_token.setter
    def add_bos_token(self, value: bool) -> None:
        self._add_bos_token = value
        self.update_post_processor()

    @property
    def add_eos_token(self) -> bool:
        return self._add_eos_token

    @add_eos_token.setter
    def add_eos_token(self, value: bool) -> None:
        self._add_eos_token = value
        self.update_post_processor()

    # ------------------------------------------------------------------ vocabulary
    @property
    def is_fast(self) -> bool:
        return True

    @property
    def backend_tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer` doing the work."""
        return self._tokenizer

    @property
    def decoder(self) -> Any:
        return self._tokenizer.decoder

    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary (without added tokens)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        """Size of the full vocabulary, added tokens included."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __bool__(self) -> bool:
        return True

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self._tokenizer.get_added_tokens_decoder()

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {token.content: i for i, token in sorted(self.added_tokens_decoder.items(), key=lambda item: item[0])}

    def get_added_vocab(self) -> dict[str, int]:
        return self.added_tokens_encoder

    def _add_tokens(self, new_tokens: list[Any], special_tokens: bool = False) -> int:
        if special_tokens:
            return self._tokenizer.add_special_tokens(new_tokens)
        return self._tokenizer.add_tokens(new_tokens)

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self._tokenizer.num_special_tokens_to_add(pair)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        """Vocabulary id of each token (the unk id for an unknown one)."""
        if isinstance(tokens, str):
            index = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if index is None else index
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self._tokenizer.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    def tokenize(
        self, text: str, pair: str | None = None, add_special_tokens: bool = False, **kwargs: Any
    ) -> list[str]:
        return self(text, text_pair=pair, add_special_tokens=add_special_tokens, **kwargs).encodings[0].tokens

    # ------------------------------------------------------------------ encode
    def __call__(
        self,
        text: str | list[str] | list[list[str]] | None = None,
        text_pair: str | list[str] | None = None,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        stride: int = 0,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
        verbose: bool = True,
        split_special_tokens: bool | None = None,
        **kwargs: Any,
    ) -> BatchEncoding:
        """Tokenize a string (or a pair), or a batch of them. Unbatched input without `return_tensors` gives flat
        lists; `return_tensors="pt"` gives `[batch, seq]` tensors. Unknown kwargs are an error."""
        if kwargs:
            raise TypeError(f"Unsupported tokenizer argument(s) {sorted(kwargs)} (text_target is not supported)")
        if text is None:
            raise ValueError("You need to specify `text`.")
        padding_strategy, truncation_strategy, max_length = self._get_padding_truncation_strategies(
            padding, truncation, max_length, pad_to_multiple_of
        )
        batched = self._check_text(text, text_pair, is_split_into_words)
        if batched:
            inputs = list(zip(text, text_pair, strict=True)) if text_pair is not None else list(text)
        else:
            inputs = [(text, text_pair) if text_pair else text]
        self.set_truncation_and_padding(
            padding_strategy, truncation_strategy, max_length, stride, pad_to_multiple_of, padding_side
        )
        split = self.split_special_tokens if split_special_tokens is None else split_special_tokens
        if self._tokenizer.encode_special_tokens != split:
            self._tokenizer.encode_special_tokens = split
        encodings = self._tokenizer.encode_batch(
            inputs, add_special_tokens=add_special_tokens, is_pretokenized=is_split_into_words
        )
        wanted = {
            "token_type_ids": return_token_type_ids,
            "attention_mask": return_attention_mask,
            "special_tokens_mask": return_special_tokens_mask,
            "offset_mapping": return_offsets_mapping,
            "length": return_length,
        }
        for key in ("token_type_ids", "attention_mask"):
            wanted[key] = key in self.model_input_names if wanted[key] is None else wanted[key]
        data, flat = self._outputs(encodings, wanted, return_overflowing_tokens)
        for ids in data["input_ids"]:
            self._warn_if_too_long(ids, max_length, verbose)
        if not batched and return_tensors is None and not return_overflowing_tokens:
            data = {k: v[0] if v and isinstance(v[0], list) else v for k, v in data.items()}
        return BatchEncoding(data, flat, tensor_type=return_tensors)

    @staticmethod
    def _outputs(encodings: list[Any], wanted: dict[str, bool], overflowing: bool) -> tuple[dict[str, list], list]:
        """The requested fields of each encoding (and of its overflowing pieces), and the flat encodings list."""
        data, flat, sample = defaultdict(list), [], []
        for index, encoding in enumerate(encodings):
            pieces = [encoding, *encoding.overflowing] if overflowing and encoding.overflowing else [encoding]
            for piece in pieces:
                data["input_ids"].append(piece.ids)
                values = {
                    "token_type_ids": piece.type_ids,
                    "attention_mask": piece.attention_mask,
                    "special_tokens_mask": piece.special_tokens_mask,
                    "offset_mapping": piece.offsets,
                    "length": len(piece.ids),
                }
                for key, value in values.items():
                    if wanted[key]:
                        data[key].append(value)
            flat.extend(pieces)
            sample.extend([index] * len(pieces))
        if overflowing:
            data["overflow_to_sample_mapping"] = sample
        return dict(data), flat

    @staticmethod
    def _check_text(text: Any, text_pair: Any, is_split_into_words: bool) -> bool:
        """Validate the input types; True for a batch."""

        def valid(t: Any, depth: int = 0) -> bool:
            if isinstance(t, str):
                return True
            if isinstance(t, (list, tuple)) and depth < 3:
                return len(t) == 0 or valid(t[0], depth + 1)
            return False

        for value in (text, text_pair):
            if value is not None and not valid(value):
                raise ValueError(
                    "text input must be of type `str` (single example), `list[str]` (batch or single pretokenized "
                    "example) or `list[list[str]]` (batch of pretokenized examples)."
                )
        if is_split_into_words:
            batched = isinstance(text, (list, tuple)) and bool(text) and isinstance(text[0], (list, tuple))
        else:
            batched = isinstance(text, (list, tuple))
        if batched and isinstance(text_pair, str):
            raise TypeError(
                "when tokenizing batches of text, `text_pair` must be a list or tuple with the same length as `text`."
            )
        if batched and text_pair is not None and len(text) != len(text_pair):
            raise ValueError(
                f"batch length of `text`: {len(text)} does not match batch length of `text_pair`: {len(text_pair)}."
            )
        return batched

    def _warn_if_too_long(self, ids: list[int], max_length: int | None, verbose: bool) -> None:
        if max_length is None and len(ids) > self.model_max_length and verbose and self.model_max_length != 0:
            logger.warning(
                "Token indices sequence length is longer than the specified maximum sequence length for this model "
                "(%d > %d). Running this sequence through the model will result in indexing errors",
                len(ids),
                self.model_max_length,
            )

    def set_truncation_and_padding(
        self,
        padding_strategy: PaddingStrategy,
        truncation_strategy: TruncationStrategy,
        max_length: int | None,
        stride: int,
        pad_to_multiple_of: int | None,
        padding_side: str | None,
    ) -> None:
        """Put this call's truncation and padding on the backend (left there for the next call, as upstream)."""
        backend = self._tokenizer
        if truncation_strategy == TruncationStrategy.DO_NOT_TRUNCATE:
            if backend.truncation is not None:
                backend.no_truncation()
        else:
            target = {
                "max_length": max_length,
                "stride": stride,
                "strategy": truncation_strategy.value,
                "direction": self.truncation_side,
            }
            current = None if backend.truncation is None else {k: backend.truncation.get(k) for k in target}
            if current != target:
                backend.enable_truncation(**target)
        if padding_strategy == PaddingStrategy.DO_NOT_PAD:
            if backend.padding is not None:
                backend.no_padding()
        else:
            target = {
                "length": max_length if padding_strategy == PaddingStrategy.MAX_LENGTH else None,
                "direction": padding_side if padding_side is not None else self.padding_side,
                "pad_id": self.pad_token_id,
                "pad_token": self.pad_token,
                "pad_type_id": self.pad_token_type_id,
                "pad_to_multiple_of": pad_to_multiple_of,
            }
            if backend.padding != target:
                backend.enable_padding(**target)

    # ------------------------------------------------------------------ decode
    def _decode(
        self,
        token_ids: int | list[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str:
        kwargs.pop("use_source_tokenizer", None)
        if kwargs:
            raise TypeError(f"Unsupported decode argument(s) {sorted(kwargs)}")
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        text = self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        clean = (
            self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        )
        if not clean:
            return text
        if (
            type(self._tokenizer.model).__name__ == "BPE"
            and not self.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output
        ):
            logger.warning(
                "Ignoring clean_up_tokenization_spaces=True for BPE tokenizer %s (it would strip spaces before "
                "punctuation); as upstream.",
                type(self).__name__,
            )
            return text
        return self.clean_up_tokenization(text)

    # ------------------------------------------------------------------ save
    def _save_backend(self, save_directory: str) -> str:
        file = os.path.join(save_directory, "tokenizer.json")
        self._tokenizer.save(file)
        return file

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name_or_path='{self.name_or_path}', vocab_size={self.vocab_size}, "
            f"model_max_length={self.model_max_length}, padding_side='{self.padding_side}', "
            f"truncation_side='{self.truncation_side}', special_tokens={self.special_tokens_map})"
        )


# Upstream 5 names the class TokenizersBackend and keeps PreTrainedTokenizerFast as the same class.
PreTrainedTokenizerFast = TokenizersBackend
