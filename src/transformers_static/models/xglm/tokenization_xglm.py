"""XGLMTokenizer: a SentencePiece Unigram (Metaspace, runs of spaces collapsed, the file's precompiled charsmap),
rebuilt from tokenizer.json as upstream's, with seven `<madeupword{i}>` specials and `</s>` (not `<s>`) before each
sequence."""

from __future__ import annotations

from typing import Any

from ...tokenization_utils_tokenizers import TokenizersBackend

MADEUP_WORDS = [f"<madeupword{i}>" for i in range(7)]
SPECIAL_TOKEN_ORDER = ("bos_token", "pad_token", "eos_token", "unk_token")


class XGLMTokenizer(TokenizersBackend):
    backend_model = "Unigram"
    init_defaults = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "cls_token": "<s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_prefix_space": True,
    }

    def __init__(self, **kwargs: Any) -> None:
        extra = list(kwargs.get("additional_special_tokens") or [])
        kwargs["additional_special_tokens"] = extra + [word for word in MADEUP_WORDS if word not in extra]
        super().__init__(**kwargs)

    def build_backend(self, kwargs: dict[str, Any]) -> Any:
        from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
        from tokenizers.models import Unigram

        vocab = kwargs.pop("vocab") or [(str(kwargs[name]), 0.0) for name in SPECIAL_TOKEN_ORDER]
        backend = Tokenizer(Unigram(vocab=vocab, unk_id=3, byte_fallback=False))
        steps = [normalizers.Replace(Regex(r" {2,}"), " ")]
        if (charsmap := kwargs.pop("precompiled_charsmap", None)) is not None:
            steps.insert(0, normalizers.Precompiled(charsmap))
        backend.normalizer = normalizers.Sequence(steps)
        scheme = "always" if kwargs["add_prefix_space"] else "never"
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
        return backend

    def _finish_init(self) -> None:
        from tokenizers import processors

        bos, eos = self.bos_token, self.eos_token
        self._tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{eos} $A",
            pair=f"{eos} $A {eos} {eos} $B",
            special_tokens=[(bos, self.bos_token_id), (eos, self.eos_token_id)],
        )
