"""Model definitions and weight loading for the real engine."""

from .config import LlamaConfig
from .llama import LlamaForCausalLM

__all__ = ["LlamaConfig", "LlamaForCausalLM"]
