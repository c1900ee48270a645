"""twinserve: an LLM serving engine and its discrete-event digital twin."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import twinserve` (and the simulator) never pulls in torch.
    if name == "LLM":
        from twinserve.backends.real.llm import LLM

        return LLM
    if name == "SamplingParams":
        from twinserve.core.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'twinserve' has no attribute {name!r}")
