"""AutoModel / AutoModelForCausalLM: the model class of a config, chosen by its `model_type`."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from ...configuration_utils import PretrainedConfig
from ...modeling_utils import PreTrainedModel
from .configuration_auto import AutoConfig, model_class

MODEL_MAPPING_NAMES = {
    "afmoe": "AfmoeModel",
    "apertus": "ApertusModel",
    "arcee": "ArceeModel",
    "axk1": "AXK1Model",
    "biogpt": "BioGptModel",
    "bitnet": "BitNetModel",
    "bloom": "BloomModel",
    "codegen": "CodeGenModel",
    "cohere": "CohereModel",
    "cohere2": "Cohere2Model",
    "cohere2_moe": "Cohere2MoeModel",
    "cohere_compass_text": "CohereCompassTextModel",
    "ctrl": "CTRLModel",
    "cwm": "CwmModel",
    "deepseek_v2": "DeepseekV2Model",
    "deepseek_v3": "DeepseekV3Model",
    "dbrx": "DbrxModel",
    "diffllama": "DiffLlamaModel",
    "doge": "DogeModel",
    "dots1": "Dots1Model",
    "ernie4_5": "Ernie4_5Model",
    "ernie4_5_moe": "Ernie4_5_MoeModel",
    "exaone4": "Exaone4Model",
    "exaone_moe": "ExaoneMoeModel",
    "falcon": "FalconModel",
    "flex_olmo": "FlexOlmoModel",
    "gemma": "GemmaModel",
    "gemma2": "Gemma2Model",
    "gemma3_text": "Gemma3TextModel",
    "gemma3n_text": "Gemma3nTextModel",
    "gemma4_text": "Gemma4TextModel",
    "gemma4_unified_text": "Gemma4UnifiedTextModel",
    "glm": "GlmModel",
    "glm4": "Glm4Model",
    "glm4_moe": "Glm4MoeModel",
    "glm4_moe_lite": "Glm4MoeLiteModel",
    "gpt2": "GPT2Model",
    "gpt_bigcode": "GPTBigCodeModel",
    "gpt_neo": "GPTNeoModel",
    "gpt_neox": "GPTNeoXModel",
    "gpt_neox_japanese": "GPTNeoXJapaneseModel",
    "gpt_oss": "GptOssModel",
    "gptj": "GPTJModel",
    "granite": "GraniteModel",
    "granite_swa": "GraniteSWAModel",
    "granitemoe": "GraniteMoeModel",
    "granitemoe_swa": "GraniteMoeSWAModel",
    "granitemoeshared": "GraniteMoeSharedModel",
    "helium": "HeliumModel",
    "hrm_text": "HrmTextModel",
    "hunyuan_v1_dense": "HunYuanDenseV1Model",
    "hunyuan_v1_moe": "HunYuanMoEV1Model",
    "hyperclovax": "HyperCLOVAXModel",
    "internlm3": "LlamaModel",
    "iquestcoder": "LlamaModel",
    "jais2": "Jais2Model",
    "jetmoe": "JetMoeModel",
    "laguna": "LagunaModel",
    "llama": "LlamaModel",
    "minicpm3": "MiniCPM3Model",
    "longcat_flash": "LongcatFlashModel",
    "mellum": "MellumModel",
    "minimax_m2": "MiniMaxM2Model",
    "ministral": "MinistralModel",
    "ministral3": "Ministral3Model",
    "mistral": "MistralModel",
    "mixtral": "MixtralModel",
    "modernbert-decoder": "ModernBertDecoderModel",
    "mpt": "MptModel",
    "nanochat": "NanoChatModel",
    "nemotron": "NemotronModel",
    "olmo": "OlmoModel",
    "olmo2": "Olmo2Model",
    "olmo3": "Olmo3Model",
    "olmoe": "OlmoeModel",
    "openai-gpt": "OpenAIGPTModel",
    "opt": "OPTModel",
    "persimmon": "PersimmonModel",
    "phi": "PhiModel",
    "phi3": "Phi3Model",
    "phimoe": "PhimoeModel",
    "qwen2": "Qwen2Model",
    "qwen2_moe": "Qwen2MoeModel",
    "qwen3": "Qwen3Model",
    "qwen3_5_moe_text": "Qwen3_5MoeTextModel",
    "qwen3_5_text": "Qwen3_5TextModel",
    "qwen3_moe": "Qwen3MoeModel",
    "qwen3_next": "Qwen3NextModel",
    "seed_oss": "SeedOssModel",
    "smollm3": "SmolLM3Model",
    "solar_open": "SolarOpenModel",
    "stablelm": "StableLmModel",
    "starcoder2": "Starcoder2Model",
    "vaultgemma": "VaultGemmaModel",
    "xglm": "XGLMModel",
    "youtu": "YoutuModel",
}

MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = {
    "afmoe": "AfmoeForCausalLM",
    "apertus": "ApertusForCausalLM",
    "arcee": "ArceeForCausalLM",
    "axk1": "AXK1ForCausalLM",
    "biogpt": "BioGptForCausalLM",
    "bitnet": "BitNetForCausalLM",
    "bloom": "BloomForCausalLM",
    "codegen": "CodeGenForCausalLM",
    "cohere": "CohereForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "cohere2_moe": "Cohere2MoeForCausalLM",
    "cohere_compass_text": "CohereCompassForCausalLM",
    "ctrl": "CTRLLMHeadModel",
    "cwm": "CwmForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "dbrx": "DbrxForCausalLM",
    "diffllama": "DiffLlamaForCausalLM",
    "doge": "DogeForCausalLM",
    "dots1": "Dots1ForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "exaone_moe": "ExaoneMoeForCausalLM",
    "falcon": "FalconForCausalLM",
    "flex_olmo": "FlexOlmoForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3n_text": "Gemma3nForCausalLM",
    "gemma4_text": "Gemma4ForCausalLM",
    "gemma4_unified_text": "Gemma4UnifiedForCausalLM",
    "glm": "GlmForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_bigcode": "GPTBigCodeForCausalLM",
    "gpt_neo": "GPTNeoForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gpt_neox_japanese": "GPTNeoXJapaneseForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gptj": "GPTJForCausalLM",
    "granite": "GraniteForCausalLM",
    "granite_swa": "GraniteSWAForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
    "granitemoe_swa": "GraniteMoeSWAForCausalLM",
    "granitemoeshared": "GraniteMoeSharedForCausalLM",
    "helium": "HeliumForCausalLM",
    "hrm_text": "HrmTextForCausalLM",
    "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
    "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM",
    "hyperclovax": "HyperCLOVAXForCausalLM",
    "internlm3": "LlamaForCausalLM",
    "iquestcoder": "LlamaForCausalLM",
    "jais2": "Jais2ForCausalLM",
    "jetmoe": "JetMoeForCausalLM",
    "laguna": "LagunaForCausalLM",
    "llama": "LlamaForCausalLM",
    "minicpm3": "MiniCPM3ForCausalLM",
    "longcat_flash": "LongcatFlashForCausalLM",
    "mellum": "MellumForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "ministral": "MinistralForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "modernbert-decoder": "ModernBertDecoderForCausalLM",
    "mpt": "MptForCausalLM",
    "nanochat": "NanoChatForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "olmo": "OlmoForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "openai-gpt": "OpenAIGPTLMHeadModel",
    "opt": "OPTForCausalLM",
    "persimmon": "PersimmonForCausalLM",
    "phi": "PhiForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phimoe": "PhimoeForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "seed_oss": "SeedOssForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "solar_open": "SolarOpenForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "vaultgemma": "VaultGemmaForCausalLM",
    "xglm": "XGLMForCausalLM",
    "youtu": "YoutuForCausalLM",
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
