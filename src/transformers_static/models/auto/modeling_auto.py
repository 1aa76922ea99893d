"""AutoModel / AutoModelForCausalLM: the model class of a config, chosen by its `model_type`."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from ...configuration_utils import PretrainedConfig
from ...modeling_utils import PreTrainedModel
from .configuration_auto import AutoConfig, model_class

MODEL_MAPPING_NAMES = {
    "bloom": "BloomModel",
    "falcon": "FalconModel",
    "gemma": "GemmaModel",
    "gemma2": "Gemma2Model",
    "gpt2": "GPT2Model",
    "gpt_neox": "GPTNeoXModel",
    "gptj": "GPTJModel",
    "llama": "LlamaModel",
    "mistral": "MistralModel",
    "opt": "OPTModel",
    "phi": "PhiModel",
    "qwen2": "Qwen2Model",
}

MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = {
    "bloom": "BloomForCausalLM",
    "falcon": "FalconForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gptj": "GPTJForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "opt": "OPTForCausalLM",
    "phi": "PhiForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


class _AutoModel:
    mapping: ClassVar[dict[str, str]]

    def __init__(self) -> None:
        raise OSError(f"{type(self).__name__} is not instantiable: use from_pretrained(dir) or from_config(config)")

    @classmethod
    def model_class(cls, config: PretrainedConfig) -> type[PreTrainedModel]:
        return model_class(config.model_type, "modeling", cls.mapping)

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> PreTrainedModel:
        return cls.model_class(config)(config)

    @classmethod
    def from_pretrained(
        cls, pretrained_path: str | os.PathLike, *, config: PretrainedConfig | None = None, **kwargs: Any
    ) -> PreTrainedModel:
        """The model class of `config` (default: the checkpoint's config.json), loaded from `pretrained_path`."""
        config = config or AutoConfig.from_pretrained(pretrained_path)
        return cls.model_class(config).from_pretrained(pretrained_path, config=config, **kwargs)


class AutoModel(_AutoModel):
    mapping = MODEL_MAPPING_NAMES


class AutoModelForCausalLM(_AutoModel):
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
