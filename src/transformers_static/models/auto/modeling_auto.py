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
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        config: PretrainedConfig | str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """The model class of the checkpoint's (or the given) config, loaded with its `from_pretrained`."""
        hub = {k: kwargs[k] for k in ("revision", "local_files_only", "cache_dir", "token") if k in kwargs}
        if not isinstance(config, PretrainedConfig):
            config = AutoConfig.from_pretrained(
                pretrained_model_name_or_path if config is None else config,
                gguf_file=kwargs.get("gguf_file") if config is None else None,
                **hub,
            )
        return cls.model_class(config).from_pretrained(pretrained_model_name_or_path, config=config, **kwargs)


class AutoModel(_AutoModel):
    mapping = MODEL_MAPPING_NAMES


class AutoModelForCausalLM(_AutoModel):
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
