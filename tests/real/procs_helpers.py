"""Helpers for tests that start child processes: are they all gone?"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

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


def broken_weights_dir(model_dir: Path, dest: Path) -> Path:
    """A copy of model_dir whose weights file is garbage: config and tokenizer load (the front end
    starts), loading the weights fails (in whichever process builds the model)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, dest / f.name)
    (dest / "model.safetensors").write_bytes(b"\xff" * 64)
    return dest
