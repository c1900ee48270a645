"""The server over worker processes: a SIGKILLed worker is a 503, SIGINT/SIGTERM stop every process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.real.procs_helpers import wait_all_gone

from .conftest import free_port, start_server, wait_for

pytestmark = pytest.mark.slow


def test_sigkill_of_a_worker_mid_stream_is_503_and_no_process_is_left(tiny_model_dir: Path) -> None:
    s = start_server(tiny_model_dir, engine_core_mode="process", tensor_parallel_size=2)
    pids = s.engine.child_pids
    assert len(pids) == 3  # the engine core and two ranks
    chunks: list[str] = []
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            with httpx.stream("POST", s.url + "/v1/completions", timeout=60, json={
                    "model": "tiny", "prompt": "the quick brown", "max_tokens": 200, "stream": True,
                    "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    chunks.append(line)
        except BaseException as e:  # a cut connection is an acceptable end too
            errors.append(e)

    t = threading.Thread(target=stream)
    t.start()
    wait_for(lambda: len(chunks) >= 3, timeout=60)
    os.kill(pids[2], signal.SIGKILL)
    waited = wait_for(lambda: httpx.get(s.url + "/health", timeout=5).status_code == 503, timeout=10)
    assert waited < 10
    t.join(30)
    assert not t.is_alive()
    body = "\n".join(chunks)
    assert errors or "error" in body.lower() or "abort" in body.lower(), body[-500:]
    r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}, timeout=10)
    assert r.status_code == 503
    s.stop()
    assert wait_all_gone(pids) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_serve_stops_the_core_and_every_worker(tiny_model_dir: Path, sig: signal.Signals) -> None:
    import psutil

    port = free_port()
    exe = Path(sys.executable).parent / "twinserve"
    proc = subprocess.Popen([str(exe), "serve", str(tiny_model_dir), "--port", str(port), "--dtype", "float64",
                             "--max-model-len", "256", "--num-gpu-blocks-override", "256", "--block-size", "4",
                             "--engine-core-mode", "process", "--tensor-parallel-size", "2", "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _health(port) == 200, timeout=180)
        kids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())]
        assert len(kids) >= 3, kids  # the core and two workers (a resource tracker may come too)
        proc.send_signal(sig)
        proc.wait(60)
        assert wait_all_gone(kids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _health(port: int) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
    except httpx.HTTPError:
        return 0
