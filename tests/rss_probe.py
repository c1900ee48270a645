"""Opt-in pytest plugin (TWINSERVE_RSS_PROBE=1): after each test module, print the process's RSS and
the engines, torch modules, threads and child processes still alive (issue 53 item 16)."""

from __future__ import annotations

import gc
import os
import sys
import threading
import types
from typing import Any

import pytest

_last: dict[str, Any] = {"module": None}


def live_counts() -> dict[str, int]:
    """Objects of the engine's heavy kinds that the garbage collector can still reach, by class name."""
    names = {"LLMEngine", "LLM", "AsyncLLMEngine", "ModelRunner", "KVCacheManager", "Scheduler",
             "EngineCoreProc", "InprocCore", "GracefulServer"}
    out: dict[str, int] = {}
    modules = 0
    params = 0
    torch = sys.modules.get("torch")
    for o in gc.get_objects():
        cls = type(o).__name__
        if cls in names:
            out[cls] = out.get(cls, 0) + 1
        elif torch is not None and isinstance(o, torch.nn.Module):
            modules += 1
        elif torch is not None and isinstance(o, torch.Tensor):
            params += o.numel() * o.element_size() if o.device.type == "cpu" and not o.is_meta else 0
    out["nn.Module"] = modules
    out["tensor_MB"] = params >> 20
    return out


def _rss_mb() -> int:
    import psutil

    return psutil.Process().memory_info().rss >> 20


def _report(module: str) -> None:
    import psutil

    gc.collect()
    kids = psutil.Process().children(recursive=True)
    counts = " ".join(f"{k}={v}" for k, v in sorted(live_counts().items()) if v)
    rss = _rss_mb()
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10  # KiB on Linux: the process's peak so far
    sys.stderr.write(f"\n[rss] {rss:6d} MB after {module} ({_trimmed_mb()} MB once malloc_trim hands free "
                     f"heap back; peak so far {peak} MB)  threads={threading.active_count()} "
                     f"children={len(kids)} {counts}\n")


def _trimmed_mb() -> int:
    """RSS after glibc's malloc_trim(0): what the heap kept only as free memory shows up as the gap."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    return _rss_mb()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Report once the last test of a module (and its module-scoped teardown) has run."""
    yield
    module = item.nodeid.split("::", 1)[0]
    if nextitem is None or nextitem.nodeid.split("::", 1)[0] != module:
        _report(module)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Baseline before any test."""
    sys.stderr.write(f"\n[rss] {_rss_mb():6d} MB at start (pid {os.getpid()})\n")


def referrer_chain(target: Any, max_depth: int = 12) -> list[str]:
    """A path of referrers from `target` up to the module that keeps it alive (breadth first)."""
    seen, frontier = {id(target)}, [(target, [])]
    for _ in range(max_depth):
        nxt: list[tuple[Any, list[str]]] = []
        for obj, path in frontier:
            for r in gc.get_referrers(obj):
                if id(r) in seen or r is frontier or r is nxt or isinstance(r, types.FrameType):
                    continue
                seen.add(id(r))
                desc = type(r).__name__
                if isinstance(r, types.FunctionType):
                    desc += f"({r.__qualname__})"
                if isinstance(r, dict):
                    desc += str([k for k, v in r.items() if v is obj][:1])
                    if isinstance(r.get("__name__"), str):
                        return path + [desc, "module " + r["__name__"]]
                if isinstance(r, types.ModuleType):
                    return path + ["module " + r.__name__]
                nxt.append((r, path + [desc]))
        frontier = nxt[:400]  # bounded: a wide graph would take minutes
    return ["(no module found)"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Name what keeps the first surviving LLMEngine alive."""
    gc.collect()
    engines = [o for o in gc.get_objects() if type(o).__name__ == "LLMEngine"]
    if engines:
        sys.stderr.write(f"\n[rss] {len(engines)} LLMEngine alive at the end; the first is held by: "
                         + " <- ".join(referrer_chain(engines[0])) + "\n")
