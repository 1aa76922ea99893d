"""transformers-static: Hugging Face-style causal LMs whose generation compiles once (static 4D masks, static caches)."""

from .cache_utils import Cache, DynamicCache, StaticCache
from .configuration_utils import PretrainedConfig
from .generation import GenerationConfig, GenerationMixin
from .modeling_attn_mask_utils import AttentionMaskConverter
from .modeling_utils import PreTrainedModel
from .models.auto import AutoConfig, AutoModel, AutoModelForCausalLM
from .models.gpt2.configuration_gpt2 import GPT2Config
from .models.gpt2.modeling_gpt2 import GPT2LMHeadModel, GPT2Model
from .models.llama.configuration_llama import LlamaConfig
from .models.llama.modeling_llama import LlamaForCausalLM, LlamaModel
from .models.mistral.configuration_mistral import MistralConfig
from .models.mistral.modeling_mistral import MistralForCausalLM, MistralModel

__version__ = "0.1.0"

__all__ = [
    "AttentionMaskConverter",
    "AutoConfig",
    "AutoModel",
    "AutoModelForCausalLM",
    "Cache",
    "DynamicCache",
    "GPT2Config",
    "GPT2LMHeadModel",
    "GPT2Model",
    "GenerationConfig",
    "GenerationMixin",
    "LlamaConfig",
    "LlamaForCausalLM",
    "LlamaModel",
    "MistralConfig",
    "MistralForCausalLM",
    "MistralModel",
    "PreTrainedModel",
    "PretrainedConfig",
    "StaticCache",
]
