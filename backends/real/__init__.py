"""The real engine: a Llama-family model on a paged KV cache behind the shared policy core.

Heavy imports (torch, transformers) happen on first use of a name below.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "LLM": ".llm",
    "LLMEngine": ".engine",
    "EngineArgs": ".config",
    "RequestOutput": ".outputs",
    "CompletionOutput": ".outputs",
    "RequestMetrics": ".outputs",
    "StepLog": ".step_log",
    "StepRecord": ".step_log",
}

__all__ = [*_EXPORTS, "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "SamplingParams":
        from twinserve.core.sampling_params import SamplingParams

        return SamplingParams
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
