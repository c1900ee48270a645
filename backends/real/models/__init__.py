"""Model definitions, the architecture registry and weight loading for the real engine."""

from twinserve.backends.real.models.architectures import ARCHITECTURES, CausalLM, model_class
from twinserve.backends.real.models.config import LlamaConfig, ModelConfig
from twinserve.backends.real.models.llama import LlamaForCausalLM

__all__ = ["ARCHITECTURES", "CausalLM", "LlamaConfig", "LlamaForCausalLM", "ModelConfig", "model_class"]
