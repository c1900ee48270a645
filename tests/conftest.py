"""Suite-wide set-up: Triton's interpreter and a fixed thread count before anything imports them."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

# Must be in effect before any @triton.jit decorator runs: this machine has no GPU driver.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"


def _import_hub_kernels() -> None:
    """Import the installed `kernels` package (transformers needs it) before our kernels/ can shadow it.

    pytest puts the repository root on sys.path for the `tests` package, and the root holds our
    kernels/ folder; `from kernels import ...` inside transformers would then find that folder.
    """
    if "kernels" in sys.modules:
        return
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    try:
        importlib.import_module("kernels")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved


_import_hub_kernels()


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
