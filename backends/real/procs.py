"""Child-process plumbing shared by the engine-core process and the worker processes."""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import os
import signal
import sys
from multiprocessing.process import BaseProcess

from twinserve.core.errors import TwinserveError

_PR_SET_PDEATHSIG = 1


class EngineStartupError(TwinserveError, RuntimeError):
    """A child process (engine core or worker) failed while starting; carries its traceback."""


def spawn_context() -> multiprocessing.context.SpawnContext:
    """Fresh interpreters (never fork a process that holds torch threads or CUDA)."""
    return multiprocessing.get_context("spawn")


def die_with_parent(parent_pid: int) -> None:
    """In a child: get SIGKILL when the parent dies (Linux), so no process is ever orphaned.

    Also ignores SIGINT: a Ctrl-C reaches the whole process group, and the parent, not each
    child, decides how to stop.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints where a child is stuck
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def stop_process(proc: BaseProcess, timeout: float = 5.0) -> None:
    """Wait for a child to exit, then SIGTERM, then SIGKILL it; always reaps it."""
    if proc.pid is None:
        return
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join(2.0)


def exit_description(code: int | None) -> str:
    """'exit code 3' or 'killed by SIGKILL'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
