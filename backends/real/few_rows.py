"""The few-row fp32 product kernel (csrc/few_rows.cpp): built lazily once per host with torch's
cpp_extension, cached under the twinserve cache folder; None, with the reason, where it cannot be.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "few_rows.cpp"
# Rows the kernel takes at most (its per-thread scratch tile).
MAX_ROWS = 64
# TWINSERVE_BUILD_EXTENSIONS=0 never compiles (a kernel built earlier still loads).
BUILD_ENV = "TWINSERVE_BUILD_EXTENSIONS"
# cpp_extension guards a build with a lock file and waits for it to go: a build killed midway
# left one behind, and every engine start after it slept forever. A build takes ~1-2 min here.
STALE_LOCK_S = 600.0


def cache_dir() -> Path:
    """Where twinserve caches per-host results: $TWINSERVE_CACHE_DIR, else ~/.cache/twinserve."""
    env = os.environ.get("TWINSERVE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "twinserve"


def _cpuinfo(key: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> set[str]:
    """The CPU's flags from /proc/cpuinfo (empty where it cannot be read)."""
    return set(_cpuinfo("flags").split())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('' where it cannot be read)."""
    return _cpuinfo("model name")


def unavailable_reason() -> str | None:
    """Why this host cannot build the kernel (None: it can)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"an x86-64 CPU (this is {platform.machine()})"
    missing = {"avx2", "fma"} - cpu_flags()
    if missing:
        return f"AVX2 and FMA (this CPU lacks {', '.join(sorted(missing))})"
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")):
        return "a C++ compiler (none on PATH, CXX unset)"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return "ninja (torch's cpp_extension builds with it)"
    return None


def _build_dir() -> Path:
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return cache_dir() / "ext" / f"few_rows-{torch.__version__}-{digest}"


def _load_built(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("twinserve_few_rows", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clear_stale_lock(build: Path, max_age_s: float = STALE_LOCK_S) -> bool:
    """Remove a build lock older than max_age_s (its build was killed); True when one was removed."""
    lock = build / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < max_age_s:
        return False
    log.warning("removing %s, left %.0f s ago by a build that did not finish", lock, age)
    lock.unlink(missing_ok=True)
    return True


@functools.cache
def load() -> tuple[ModuleType | None, str]:
    """(the compiled module, "") or (None, why not); compiles on first use, then loads the cached build."""
    why = unavailable_reason()
    if why is not None:
        return None, f"needs {why}"
    build = _build_dir()
    built = sorted(build.glob("twinserve_few_rows*.so"))
    if built:
        try:  # a finished build loads as it is: no lock to wait on
            return _load_built(built[0]), ""
        except Exception as e:  # e.g. a link cut short: build it again below
            log.warning("the cached few-row kernel %s did not load (%s)", built[0], e)
    if os.environ.get(BUILD_ENV, "1") == "0":
        return None, f"not built on this host and {BUILD_ENV}=0"
    clear_stale_lock(build)
    try:
        from torch.utils.cpp_extension import load as cpp_load

        build.mkdir(parents=True, exist_ok=True)
        log.warning("building the few-row product kernel once for this host into %s", build)
        module = cpp_load("twinserve_few_rows", [str(SOURCE)], extra_cflags=["-O3", "-mavx2", "-mfma"],
                          build_directory=str(build), verbose=False)
    except Exception as e:  # a broken toolchain must leave the engine on torch's products
        return None, f"did not build: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return module, ""
