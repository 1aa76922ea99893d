"""AutoTokenizer: the tokenizer class of a checkpoint, chosen as upstream chooses it (tokenizer_config.json's
`tokenizer_class`, corrected by the model type's registered class), among the classes implemented here."""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from ...configuration_utils import load_config_dict
from ...integrations.ggml_tokenizer import SPECIAL_TOKEN_IDS, gguf_tokenizer_kwargs
from ...modeling_gguf_pytorch_utils import gguf_model_type, load_gguf_tokenizer_data
from ...tokenization_files import (
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    _read_json,
    load_tokenizer,
)
from ...tokenization_utils_tokenizers import TokenizersBackend

# model_type -> upstream's registered tokenizer class, for our model types (absent: none); a test keeps it equal to
# upstream's. A class not in TOKENIZER_CLASSES is refused by name.
TOKENIZER_MAPPING_NAMES = {
    "biogpt": "BioGptTokenizer",
    "codegen": "GPT2Tokenizer",
    "cohere": "CohereTokenizer",
    "cohere2": "CohereTokenizer",
    "ctrl": "CTRLTokenizer",
    "dbrx": "GPT2Tokenizer",
    "ernie4_5": "TokenizersBackend",
    "ernie4_5_moe": "TokenizersBackend",
    "flex_olmo": "TokenizersBackend",
    "gemma": "GemmaTokenizer",
    "gemma2": "GemmaTokenizer",
    "gemma3_text": "GemmaTokenizer",
    "gemma3n_text": "GemmaTokenizer",
    "glm": "TokenizersBackend",
    "glm4": "TokenizersBackend",
    "glm4_moe": "TokenizersBackend",
    "glm4_moe_lite": "TokenizersBackend",
    "gpt2": "GPT2Tokenizer",
    "gpt_bigcode": "TokenizersBackend",
    "gpt_neo": "GPT2Tokenizer",
    "gpt_neox": "GPTNeoXTokenizer",
    "gpt_neox_japanese": "GPTNeoXJapaneseTokenizer",
    "gptj": "GPT2Tokenizer",
    "granite": "TokenizersBackend",
    "granitemoe": "TokenizersBackend",
    "granitemoeshared": "TokenizersBackend",
    "hyperclovax": "TokenizersBackend",
    "internlm3": "TokenizersBackend",
    "iquestcoder": "TokenizersBackend",
    "jais2": "GPT2Tokenizer",
    "minicpm3": "TokenizersBackend",
    "minimax_m2": "TokenizersBackend",
    "ministral": "TokenizersBackend",
    "ministral3": "TokenizersBackend",
    "mistral": "TokenizersBackend",
    "mixtral": "TokenizersBackend",
    "modernbert-decoder": "TokenizersBackend",
    "mpt": "GPTNeoXTokenizer",
    "nemotron": "TokenizersBackend",
    "olmo": "GPTNeoXTokenizer",
    "olmo2": "TokenizersBackend",
    "olmo3": "TokenizersBackend",
    "olmoe": "GPTNeoXTokenizer",
    "openai-gpt": "OpenAIGPTTokenizer",
    "opt": "GPT2Tokenizer",
    "persimmon": "TokenizersBackend",
    "phi": "GPT2Tokenizer",
    "phi3": "TokenizersBackend",
    "phimoe": "TokenizersBackend",
    "qwen2": "Qwen2Tokenizer",
    "qwen2_moe": "Qwen2Tokenizer",
    "qwen3": "Qwen2Tokenizer",
    "qwen3_5_moe_text": "Qwen3_5Tokenizer",
    "qwen3_5_text": "Qwen3_5Tokenizer",
    "qwen3_moe": "Qwen2Tokenizer",
    "qwen3_next": "Qwen2Tokenizer",
    "stablelm": "TokenizersBackend",
    "starcoder2": "GPT2Tokenizer",
    "xglm": "XGLMTokenizer",
}
# Model types whose Hub tokenizer_class upstream overrides with the registered class.
MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS = {
    "ernie4_5",
    "ernie4_5_moe",
    "hyperclovax",
    "internlm3",
    "iquestcoder",
    "minicpm3",
    "minimax_m2",
    "modernbert-decoder",
    "nemotron",
    "phi3",
    "phimoe",
    "qwen2",
    "qwen3_5_moe_text",
}
BACKEND_NAMES = {"TokenizersBackend", "PreTrainedTokenizerFast", "PreTrainedTokenizer", "BloomTokenizer"}
# Class name -> module of its implementation here.
TOKENIZER_CLASSES = {
    "CohereTokenizer": "cohere",
    "GPT2Tokenizer": "gpt2",
    "GPTNeoXTokenizer": "gpt_neox",
    "GemmaTokenizer": "gemma",
    "LlamaTokenizer": "llama",
    "OpenAIGPTTokenizer": "openai",
    "Qwen2Tokenizer": "qwen2",
    "Qwen3_5Tokenizer": "qwen3_5",
    "XGLMTokenizer": "xglm",
}


def tokenizer_class_from_name(name: str) -> type[TokenizersBackend]:
    """Our class for an upstream tokenizer class name (a "Fast" suffix is ignored); an unknown name is an error
    rather than a silent fall-back to tokenizer.json as it is."""
    name = name.removesuffix("Fast")
    if name in BACKEND_NAMES:
        return TokenizersBackend
    if name not in TOKENIZER_CLASSES:
        supported = sorted({*TOKENIZER_CLASSES, "PreTrainedTokenizerFast", "TokenizersBackend"})
        raise ValueError(
            f"Tokenizer class {name!r} is not supported by transformers_static; supported: {', '.join(supported)}. "
            'To use tokenizer.json exactly as it is, set "tokenizer_class": "PreTrainedTokenizerFast" in '
            "tokenizer_config.json."
        )
    module = importlib.import_module(
        f"transformers_static.models.{TOKENIZER_CLASSES[name]}.tokenization_{TOKENIZER_CLASSES[name]}"
    )
    return getattr(module, name)


class AutoTokenizer:
    """`AutoTokenizer.from_pretrained(dir_or_hub_id)`."""

    def __init__(self) -> None:
        raise OSError("AutoTokenizer is not instantiable: use AutoTokenizer.from_pretrained(dir)")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> TokenizersBackend:
        """The checkpoint's tokenizer (a directory, or a Hub id with `revision`, `local_files_only`, `cache_dir`,
        `token`); other kwargs override tokenizer_config.json settings (`padding_side="left"`, `pad_token=...`).
        `use_fast` is ignored (every tokenizer is a fast one, as in upstream 5), and so is `trust_remote_code` (with
        a warning) unless the checkpoint needs remote code, which is an error. `config=` may give the model type;
        with `gguf_file=` the GGUF's own model type decides the class, as upstream's does."""
        kwargs.pop("use_fast", None)
        if kwargs.pop("tokenizer_type", None):
            raise ValueError(
                "AutoTokenizer.from_pretrained(tokenizer_type=...) is not supported by transformers_static"
            )
        config = kwargs.pop("config", None)
        gguf_file = kwargs.get("gguf_file")

        def select(path: str) -> type[TokenizersBackend]:
            if gguf_file is None:
                return select_tokenizer_class(path, config)
            return select_tokenizer_class(path, {"model_type": gguf_model_type(os.path.join(path, gguf_file))})

        return load_tokenizer(select, pretrained_model_name_or_path, caller="AutoTokenizer.from_pretrained", **kwargs)


def select_tokenizer_class(path: str, config: Any = None) -> type[TokenizersBackend]:
    """Upstream's choice: a LlamaTokenizer over a byte-level tokenizer.json -> TokenizersBackend; a Hub class that
    differs from the model type's registered class -> the Hub class (the registered one for model types known to
    ship a wrong one) if specialised, else TokenizersBackend; otherwise tokenizer_config.json's class, the config's
    `tokenizer_class`, the registered class, TokenizersBackend."""
    config_file = os.path.join(path, TOKENIZER_CONFIG_FILE)
    tokenizer_config = _read_json(config_file) if os.path.isfile(config_file) else {}
    if tokenizer_config.get("auto_map"):
        raise ValueError(f"{path!r} needs custom tokenizer code (auto_map); transformers_static runs no remote code")
    model_config = _model_config(path, config)
    model_type = model_config.get("model_type") or None
    declared = tokenizer_config.get("tokenizer_class") or model_config.get("tokenizer_class")
    registered = TOKENIZER_MAPPING_NAMES.get(model_type)
    if (
        declared
        and declared.removesuffix("Fast") == "LlamaTokenizer"
        and model_type not in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
        and _is_byte_level(os.path.join(path, TOKENIZER_FILE))
    ):
        return TokenizersBackend
    if declared and registered and registered.removesuffix("Fast") != declared.removesuffix("Fast"):
        if registered in BACKEND_NAMES:
            return TokenizersBackend
        name = registered if model_type in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS else declared
        return tokenizer_class_from_name(name)
    if declared:
        return tokenizer_class_from_name(declared)
    return tokenizer_class_for_model_type(model_type)


def tokenizer_class_for_model_type(model_type: str | None) -> type[TokenizersBackend]:
    """The model type's registered tokenizer class, TokenizersBackend for a model type that has none."""
    registered = TOKENIZER_MAPPING_NAMES.get(model_type)
    return tokenizer_class_from_name(registered) if registered else TokenizersBackend


def _is_byte_level(tokenizer_file: str) -> bool:
    """Whether tokenizer.json declares a ByteLevel pre-tokenizer or decoder (upstream's text test)."""
    if not os.path.isfile(tokenizer_file):
        return False
    with open(tokenizer_file, encoding="utf-8") as f:
        return '"ByteLevel"' in f.read()


def _model_config(path: str, config: Any) -> dict[str, Any]:
    """The model config as a dict: the `config` passed (an object or a dict), else config.json beside the tokenizer,
    else empty."""
    if isinstance(config, dict):
        return config
    if config is not None:
        return {"model_type": config.model_type, "tokenizer_class": getattr(config, "tokenizer_class", None)}
    try:
        return load_config_dict(path)
    except OSError:
        return {}


# ---------------------------------------------------------------------- a GGUF's tokenizer as files
def load_gguf_tokenizer_files(gguf_path: str | os.PathLike) -> dict[str, str]:
    """The tokenizer of a GGUF file as the files of an ordinary checkpoint, `{file name: JSON text}`:
    tokenizer.json (the rebuilt `tokenizers.Tokenizer` with its post-processor), tokenizer_config.json (the class
    AutoTokenizer picks for the file's model type; the special tokens, null where the file names none, so the
    class's defaults stay unset as for the GGUF; add_bos_token / add_eos_token; the chat template) and
    special_tokens_map.json (the named special tokens)."""
    kwargs = gguf_tokenizer_kwargs(load_gguf_tokenizer_data(gguf_path))
    tokenizer = TokenizersBackend(**kwargs)
    config = {key: value for key, value in kwargs.items() if key != "tokenizer_object"}
    config.update(add_bos_token=tokenizer.add_bos_token, add_eos_token=tokenizer.add_eos_token)
    specials = {name: config[name] for name in SPECIAL_TOKEN_IDS if config[name] is not None}
    tokenizer_class = tokenizer_class_for_model_type(gguf_model_type(gguf_path)).__name__
    config.update(tokenizer_class=tokenizer_class, clean_up_tokenization_spaces=False)
    return {
        TOKENIZER_FILE: tokenizer.backend_tokenizer.to_str(pretty=True),
        TOKENIZER_CONFIG_FILE: json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True) + "\n",
        SPECIAL_TOKENS_MAP_FILE: json.dumps(specials, indent=2, ensure_ascii=False, sort_keys=True) + "\n",
    }


def save_gguf_tokenizer(gguf_path: str | os.PathLike, save_directory: str | os.PathLike) -> list[str]:
    """Write `load_gguf_tokenizer_files` into `save_directory`; returns the paths written."""
    files = load_gguf_tokenizer_files(gguf_path)
    os.makedirs(save_directory, exist_ok=True)
    paths = []
    for name, text in files.items():
        paths.append(os.path.join(save_directory, name))
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.write(text)
    return paths
