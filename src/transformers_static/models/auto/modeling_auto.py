"""AutoModel / AutoModelForCausalLM: the model class of a config, chosen by its `model_type`."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from ...configuration_utils import PretrainedConfig
from ...modeling_utils import PreTrainedModel
from .configuration_auto import AutoConfig, model_class

MODEL_MAPPING_NAMES = {
    "gpt2": "GPT2Model",
    "llama": "LlamaModel",
    "mistral": "MistralModel",
}

MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
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
    def from_pretrained(cls, pretrained_path: str | os.PathLike, **kwargs: Any) -> PreTrainedModel:
        config = AutoConfig.from_pretrained(pretrained_path)
        return cls.model_class(config).from_pretrained(pretrained_path, config=config, **kwargs)


class AutoModel(_AutoModel):
    mapping = MODEL_MAPPING_NAMES


class AutoModelForCausalLM(_AutoModel):
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
