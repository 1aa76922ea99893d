"""transformers-static: Hugging Face-style causal LMs whose generation compiles once (static 4D masks, static caches).

Architecture classes (`LlamaConfig`, `LlamaModel`, `LlamaForCausalLM`, `LlamaTokenizer`, ...) are imported on
first use, from the same tables the auto classes use, so `import transformers_static` loads no model file.
"""

import importlib
from typing import Any

from .cache_utils import Cache, DynamicCache, StaticCache
from .configuration_utils import PretrainedConfig
from .generation import GenerationConfig, GenerationMixin
from .generation.streamers import AsyncTextIteratorStreamer, BaseStreamer, TextIteratorStreamer, TextStreamer
from .modeling_attn_mask_utils import AttentionMaskConverter
from .modeling_utils import PreTrainedModel
from .models.auto import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
from .models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_module_name
from .models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES
from .models.auto.tokenization_auto import TOKENIZER_CLASSES
from .pipelines import TextGenerationPipeline, pipeline
from .tokenization_utils_base import BatchEncoding
from .tokenization_utils_tokenizers import PreTrainedTokenizerFast, TokenizersBackend

__version__ = "0.1.0"

# Public architecture class -> the module defining it, relative to this package.
_ARCHITECTURE_CLASSES = {
    name: f".models.{model_module_name(model_type, kind)}.{kind}_{model_module_name(model_type, kind)}"
    for kind, mapping in (
        ("configuration", CONFIG_MAPPING_NAMES),
        ("modeling", MODEL_MAPPING_NAMES),
        ("modeling", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        ("tokenization", {model_type: name for name, model_type in TOKENIZER_CLASSES.items()}),
    )
    for model_type, name in mapping.items()
}


def __getattr__(name: str) -> Any:
    if name in _ARCHITECTURE_CLASSES:
        return getattr(importlib.import_module(_ARCHITECTURE_CLASSES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AsyncTextIteratorStreamer",
    "AttentionMaskConverter",
    "AutoConfig",
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoTokenizer",
    "BaseStreamer",
    "BatchEncoding",
    "Cache",
    "DynamicCache",
    "GenerationConfig",
    "GenerationMixin",
    "PreTrainedModel",
    "PreTrainedTokenizerFast",
    "PretrainedConfig",
    "StaticCache",
    "TextGenerationPipeline",
    "TextIteratorStreamer",
    "TextStreamer",
    "TokenizersBackend",
    "pipeline",
    *sorted(_ARCHITECTURE_CLASSES),
]
