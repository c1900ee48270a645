"""Suite-wide set-up: Triton's interpreter and a fixed thread count before anything imports them."""

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

# Must be in effect before any @triton.jit decorator runs: this machine has no GPU driver.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load_experiment(name: str) -> ModuleType:
    """A script under experiments/ (experiments/NAME.py), loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def experiment():
    """experiment("NAME"): experiments/NAME.py loaded as a module."""
    return load_experiment
