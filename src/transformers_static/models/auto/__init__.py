from .configuration_auto import CONFIG_MAPPING_NAMES, AutoConfig
from .modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, AutoModel, AutoModelForCausalLM
from .tokenization_auto import AutoTokenizer

__all__ = [
    "CONFIG_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoConfig",
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoTokenizer",
]
