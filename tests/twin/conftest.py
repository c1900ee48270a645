"""Fixtures: the tiny random Llama of tests/real, as an engine the twin can drive."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from ..real.conftest import make_tiny_model_dir

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder (2 layers, vocab ~300)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("twin_tiny"))


@pytest.fixture
def make_engine(tiny_model: Path) -> Callable[..., Any]:
    """Factory: an LLMEngine over the tiny model, small defaults, overridable."""
    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.engine import LLMEngine

    def build(**kw: Any) -> Any:
        args = dict(model=str(tiny_model), dtype="float64", max_model_len=256,
                    num_gpu_blocks_override=256, block_size=4, max_num_batched_tokens=64)
        args.update(kw)
        return LLMEngine(EngineArgs(**args))

    return build
