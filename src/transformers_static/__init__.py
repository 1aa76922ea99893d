"""transformers-static: Hugging Face-style causal LMs whose generation compiles once (static 4D masks, static caches)."""

from .cache_utils import Cache, DynamicCache, StaticCache
from .configuration_utils import PretrainedConfig
from .generation import GenerationConfig, GenerationMixin
from .generation.streamers import AsyncTextIteratorStreamer, BaseStreamer, TextIteratorStreamer, TextStreamer
from .modeling_attn_mask_utils import AttentionMaskConverter
from .modeling_utils import PreTrainedModel
from .models.auto import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
from .models.bloom.configuration_bloom import BloomConfig
from .models.bloom.modeling_bloom import BloomForCausalLM, BloomModel
from .models.falcon.configuration_falcon import FalconConfig
from .models.falcon.modeling_falcon import FalconForCausalLM, FalconModel
from .models.gemma.configuration_gemma import GemmaConfig
from .models.gemma.modeling_gemma import GemmaForCausalLM, GemmaModel
from .models.gemma.tokenization_gemma import GemmaTokenizer
from .models.gemma2.configuration_gemma2 import Gemma2Config
from .models.gemma2.modeling_gemma2 import Gemma2ForCausalLM, Gemma2Model
from .models.gpt2.configuration_gpt2 import GPT2Config
from .models.gpt2.modeling_gpt2 import GPT2LMHeadModel, GPT2Model
from .models.gpt2.tokenization_gpt2 import GPT2Tokenizer
from .models.gpt_neox.configuration_gpt_neox import GPTNeoXConfig
from .models.gpt_neox.modeling_gpt_neox import GPTNeoXForCausalLM, GPTNeoXModel
from .models.gpt_neox.tokenization_gpt_neox import GPTNeoXTokenizer
from .models.gptj.configuration_gptj import GPTJConfig
from .models.gptj.modeling_gptj import GPTJForCausalLM, GPTJModel
from .models.llama.configuration_llama import LlamaConfig
from .models.llama.modeling_llama import LlamaForCausalLM, LlamaModel
from .models.llama.tokenization_llama import LlamaTokenizer
from .models.mistral.configuration_mistral import MistralConfig
from .models.mistral.modeling_mistral import MistralForCausalLM, MistralModel
from .models.opt.configuration_opt import OPTConfig
from .models.opt.modeling_opt import OPTForCausalLM, OPTModel
from .models.phi.configuration_phi import PhiConfig
from .models.phi.modeling_phi import PhiForCausalLM, PhiModel
from .models.qwen2.configuration_qwen2 import Qwen2Config
from .models.qwen2.modeling_qwen2 import Qwen2ForCausalLM, Qwen2Model
from .models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
from .pipelines import TextGenerationPipeline, pipeline
from .tokenization_utils_base import BatchEncoding
from .tokenization_utils_tokenizers import PreTrainedTokenizerFast, TokenizersBackend

__version__ = "0.1.0"

__all__ = [
    "AsyncTextIteratorStreamer",
    "AttentionMaskConverter",
    "AutoConfig",
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoTokenizer",
    "BaseStreamer",
    "BatchEncoding",
    "BloomConfig",
    "BloomForCausalLM",
    "BloomModel",
    "Cache",
    "DynamicCache",
    "FalconConfig",
    "FalconForCausalLM",
    "FalconModel",
    "GPT2Config",
    "GPT2LMHeadModel",
    "GPT2Model",
    "GPT2Tokenizer",
    "GPTJConfig",
    "GPTJForCausalLM",
    "GPTJModel",
    "GPTNeoXConfig",
    "GPTNeoXForCausalLM",
    "GPTNeoXModel",
    "GPTNeoXTokenizer",
    "Gemma2Config",
    "Gemma2ForCausalLM",
    "Gemma2Model",
    "GemmaConfig",
    "GemmaForCausalLM",
    "GemmaModel",
    "GemmaTokenizer",
    "GenerationConfig",
    "GenerationMixin",
    "LlamaConfig",
    "LlamaForCausalLM",
    "LlamaModel",
    "LlamaTokenizer",
    "MistralConfig",
    "MistralForCausalLM",
    "MistralModel",
    "OPTConfig",
    "OPTForCausalLM",
    "OPTModel",
    "PhiConfig",
    "PhiForCausalLM",
    "PhiModel",
    "PreTrainedModel",
    "PreTrainedTokenizerFast",
    "PretrainedConfig",
    "Qwen2Config",
    "Qwen2ForCausalLM",
    "Qwen2Model",
    "Qwen2Tokenizer",
    "StaticCache",
    "TextGenerationPipeline",
    "TextIteratorStreamer",
    "TextStreamer",
    "TokenizersBackend",
    "pipeline",
]
