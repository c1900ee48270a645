"""Model definitions and weight loading for the real engine."""

from twinserve.backends.real.models.config import LlamaConfig
from twinserve.backends.real.models.llama import LlamaForCausalLM

__all__ = ["LlamaConfig", "LlamaForCausalLM"]
