"""Suite-wide set-up: Triton's interpreter and a fixed thread count before anything imports them,
and the Hypothesis profiles (docs/testing.md)."""

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

# Must be in effect before any @triton.jit decorator runs: this machine has no GPU driver.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]

# TWINSERVE_RSS_PROBE=1: print RSS and live engines after each test module (tests/rss_probe.py).
if os.environ.get("TWINSERVE_RSS_PROBE"):
    pytest_plugins = ["tests.rss_probe"]
EXPERIMENTS = ROOT / "experiments"

# "ci": the same examples on every run (each test's seed comes from the test itself), so a
# red CI is a change in the code, never a new draw. Hypothesis allows no example database
# with derandomize: regressions it ever found are pinned as plain tests.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
# "random": fresh examples (seed from --hypothesis-seed, printed in the header), failures
# saved to a fixed database that later random runs replay first. Nightly-style, not CI.
settings.register_profile("random", derandomize=False, deadline=None, print_blob=True,
                          database=DirectoryBasedExampleDatabase(ROOT / ".hypothesis" / "random-examples"))
# HYPOTHESIS_PROFILE picks one without a flag; --hypothesis-profile still wins.
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def pytest_report_header(config: pytest.Config) -> str:
    """Say which Hypothesis profile ran, and mark a random-seed run as one."""
    name = settings.get_current_profile_name()
    if name == "random":
        seed = config.getoption("hypothesis_seed", None)
        return (f"hypothesis: RANDOM-SEED RUN (profile 'random', seed {seed}): a failure may be a new "
                f"example, not a change; rerun it with --hypothesis-seed={seed}")
    if name == "ci":
        return "hypothesis: derandomised run (profile 'ci'): the same examples every time"
    return f"hypothesis: profile {name!r}"


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


@pytest.fixture(autouse=True)
def _root_off_sys_path() -> None:
    """Keep the repository root off sys.path while a test runs (pytest puts it back per package).

    A spawned process starts with its parent's sys.path, so a worker would otherwise import our
    kernels/ when transformers asks for its `kernels` package.
    """
    if any(Path(p or ".").resolve() == ROOT for p in sys.path):
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]


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


def _release_freed_heap() -> None:
    """gc, then glibc's malloc_trim(0): hand the heap's free pages back to the OS.

    A module that loads SmolLM2 frees its tensors at teardown, but glibc keeps the freed heap:
    tests/real/test_smollm2.py left 3826 MB of RSS with no tensor alive, 658 MB after a trim
    (issue 53 item 16). Without glibc (musl, macOS) this does nothing.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """After a module's last test and its module-scoped teardown, release what it freed."""
    yield
    if nextitem is None or nextitem.path != item.path:
        _release_freed_heap()
