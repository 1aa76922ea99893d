"""AutoConfig: the config class of a checkpoint, chosen by its `model_type`."""

from __future__ import annotations

import importlib
import os
from typing import Any

from ...configuration_utils import PretrainedConfig, load_config_dict
from ...utils.hub import refuse_unsupported_hub_arguments

CONFIG_MAPPING_NAMES = {
    "afmoe": "AfmoeConfig",
    "apertus": "ApertusConfig",
    "arcee": "ArceeConfig",
    "axk1": "AXK1Config",
    "biogpt": "BioGptConfig",
    "bitnet": "BitNetConfig",
    "bloom": "BloomConfig",
    "codegen": "CodeGenConfig",
    "cohere": "CohereConfig",
    "cohere2": "Cohere2Config",
    "cohere2_moe": "Cohere2MoeConfig",
    "cohere_compass_text": "CohereCompassTextConfig",
    "ctrl": "CTRLConfig",
    "cwm": "CwmConfig",
    "deepseek_v2": "DeepseekV2Config",
    "deepseek_v3": "DeepseekV3Config",
    "dbrx": "DbrxConfig",
    "diffllama": "DiffLlamaConfig",
    "doge": "DogeConfig",
    "dots1": "Dots1Config",
    "ernie4_5": "Ernie4_5Config",
    "ernie4_5_moe": "Ernie4_5_MoeConfig",
    "exaone4": "Exaone4Config",
    "exaone_moe": "ExaoneMoeConfig",
    "falcon": "FalconConfig",
    "flex_olmo": "FlexOlmoConfig",
    "flint": "FlintConfig",
    "gemma": "GemmaConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
    "gemma3n_text": "Gemma3nTextConfig",
    "gemma4_text": "Gemma4TextConfig",
    "gemma4_unified_text": "Gemma4UnifiedTextConfig",
    "glm": "GlmConfig",
    "glm4": "Glm4Config",
    "glm4_moe": "Glm4MoeConfig",
    "glm4_moe_lite": "Glm4MoeLiteConfig",
    "gpt2": "GPT2Config",
    "gpt_bigcode": "GPTBigCodeConfig",
    "gpt_neo": "GPTNeoConfig",
    "gpt_neox": "GPTNeoXConfig",
    "gpt_neox_japanese": "GPTNeoXJapaneseConfig",
    "gpt_oss": "GptOssConfig",
    "gptj": "GPTJConfig",
    "granite": "GraniteConfig",
    "granite_swa": "GraniteSWAConfig",
    "granitemoe": "GraniteMoeConfig",
    "granitemoe_swa": "GraniteMoeSWAConfig",
    "granitemoeshared": "GraniteMoeSharedConfig",
    "helium": "HeliumConfig",
    "hrm_text": "HrmTextConfig",
    "hunyuan_v1_dense": "HunYuanDenseV1Config",
    "hunyuan_v1_moe": "HunYuanMoEV1Config",
    "hyperclovax": "HyperCLOVAXConfig",
    "internlm3": "InternLM3Config",
    "iquestcoder": "IQuestCoderConfig",
    "jais2": "Jais2Config",
    "jetmoe": "JetMoeConfig",
    "laguna": "LagunaConfig",
    "llama": "LlamaConfig",
    "minicpm3": "MiniCPM3Config",
    "longcat_flash": "LongcatFlashConfig",
    "mellum": "MellumConfig",
    "minimax_m2": "MiniMaxM2Config",
    "ministral": "MinistralConfig",
    "ministral3": "Ministral3Config",
    "mistral": "MistralConfig",
    "mixtral": "MixtralConfig",
    "modernbert-decoder": "ModernBertDecoderConfig",
    "mpt": "MptConfig",
    "nanochat": "NanoChatConfig",
    "nemotron": "NemotronConfig",
    "olmo": "OlmoConfig",
    "olmo2": "Olmo2Config",
    "olmo3": "Olmo3Config",
    "olmoe": "OlmoeConfig",
    "openai-gpt": "OpenAIGPTConfig",
    "opt": "OPTConfig",
    "persimmon": "PersimmonConfig",
    "phi": "PhiConfig",
    "phi3": "Phi3Config",
    "phimoe": "PhimoeConfig",
    "qwen2": "Qwen2Config",
    "qwen2_moe": "Qwen2MoeConfig",
    "qwen3": "Qwen3Config",
    "qwen3_5_moe_text": "Qwen3_5MoeTextConfig",
    "qwen3_5_text": "Qwen3_5TextConfig",
    "qwen3_moe": "Qwen3MoeConfig",
    "qwen3_next": "Qwen3NextConfig",
    "seed_oss": "SeedOssConfig",
    "smollm3": "SmolLM3Config",
    "solar_open": "SolarOpenConfig",
    "stablelm": "StableLmConfig",
    "starcoder2": "Starcoder2Config",
    "vaultgemma": "VaultGemmaConfig",
    "xglm": "XGLMConfig",
    "youtu": "YoutuConfig",
}


# model_types whose package is named otherwise (upstream's text-only models live in their family's package)
MODEL_TYPE_TO_MODULE_NAME = {
    "cohere_compass_text": "cohere_compass",
    "gemma3_text": "gemma3",
    "gemma3n_text": "gemma3n",
    "gemma4_text": "gemma4",
    "gemma4_unified_text": "gemma4_unified",
    "modernbert-decoder": "modernbert_decoder",
    "openai-gpt": "openai",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_5_text": "qwen3_5",
}


# model_types whose model classes are another type's (upstream's auto classes build Llama's classes for these, with
# the type's own config): the package of their `modeling` module
MODELING_MODULE_NAME = {
    "internlm3": "llama",
    "iquestcoder": "llama",
}


def model_module_name(model_type: str, kind: str = "configuration") -> str:
    """The `models/<name>/` package of a model_type's `kind` module."""
    if kind == "modeling" and model_type in MODELING_MODULE_NAME:
        return MODELING_MODULE_NAME[model_type]
    return MODEL_TYPE_TO_MODULE_NAME.get(model_type, model_type)


# Decoder-only model types of upstream that cannot run on the static contract exactly: model_type -> why (the error
# a checkpoint of one gets; docs/MODELS.md lists them as refused)
REFUSED_MODEL_TYPES = {
    "cpmant": (
        "a prefix LM: upstream marks every token of a forward call as context, attended both ways (the prompt sees "
        "its later tokens), which a chunked static prefill cannot reproduce; a causal port would diverge silently"
    ),
    "reformer": (
        "LSH attention hashes keys with fresh random rotations each forward and attends within chunks of the "
        "bucket-sorted sequence (data-dependent, no static 4D mask); its local attention uses chunk-aligned windows; "
        "upstream's generate drops the attention mask, so its tokens on left-padded batches cannot be matched"
    ),
}


def model_class(model_type: str, kind: str, mapping: dict[str, str]) -> type:
    """Import `mapping[model_type]` from `models/<package>/<kind>_<package>.py`."""
    if model_type in REFUSED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported: {REFUSED_MODEL_TYPES[model_type]}")
    if model_type not in mapping:
        raise ValueError(f"Unknown model_type {model_type!r}; supported model types: {', '.join(sorted(mapping))}")
    name = model_module_name(model_type, kind)
    module = importlib.import_module(f"transformers_static.models.{name}.{kind}_{name}")
    return getattr(module, mapping[model_type])


class AutoConfig:
    """`AutoConfig.from_pretrained(dir)` / `AutoConfig.for_model("llama", ...)`."""

    def __init__(self) -> None:
        raise OSError("AutoConfig is not instantiable: use AutoConfig.from_pretrained(dir) or AutoConfig.for_model()")

    @staticmethod
    def for_model(model_type: str, **kwargs: Any) -> PretrainedConfig:
        return model_class(model_type, "configuration", CONFIG_MAPPING_NAMES)(**kwargs)

    @staticmethod
    def from_pretrained(
        pretrained_path: str | os.PathLike,
        gguf_file: str | None = None,
        *,
        revision: str | None = None,
        local_files_only: bool = False,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        **overrides: Any,
    ) -> PretrainedConfig:
        """The config of a checkpoint directory or Hub id (`revision`, `local_files_only`, `cache_dir`, `token`: see
        `utils.hub.resolve_pretrained_path`), or of its `gguf_file`, in the class of its `model_type`; `overrides`
        set config fields."""
        refuse_unsupported_hub_arguments("AutoConfig.from_pretrained", overrides)
        hub = {"revision": revision, "local_files_only": local_files_only, "cache_dir": cache_dir, "token": token}
        config_dict = load_config_dict(pretrained_path, gguf_file, **hub)
        if "model_type" not in config_dict:
            raise ValueError(
                f"config.json at {os.fspath(pretrained_path)!r} has no 'model_type'; "
                f"supported model types: {', '.join(sorted(CONFIG_MAPPING_NAMES))}"
            )
        config_cls = model_class(config_dict["model_type"], "configuration", CONFIG_MAPPING_NAMES)
        return config_cls.from_dict(config_dict, **overrides)
