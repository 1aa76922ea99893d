from .configuration_utils import GenerationConfig
from .utils import GenerationMixin

__all__ = ["GenerationConfig", "GenerationMixin"]
