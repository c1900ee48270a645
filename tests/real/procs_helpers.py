"""Helpers for tests that start child processes: are they all gone?"""

from __future__ import annotations

import time

import psutil


def alive(pid: int) -> bool:
    """True while pid runs (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_all_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    """Poll until none of pids runs; the ones still running after timeout."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left
