"""Fixtures: the real server on a free loopback port, in-process (uvicorn on a thread), over the tiny model."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import torch

from tests.real.conftest import make_tiny_model_dir

torch.set_num_threads(1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    """A server started by a test: its URL, its app state, and how to stop it."""

    url: str
    state: Any
    server: Any
    thread: threading.Thread

    @property
    def engine(self) -> Any:
        """The LLMEngine behind the server."""
        return self.state.engine

    def client(self, api_key: str = "none", **kw: Any) -> Any:
        """An official openai client pointed at this server."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60, **kw)

    def stop(self, timeout: float = 30.0) -> float:
        """Ask uvicorn to exit and wait for it; seconds it took."""
        t = time.monotonic()
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "server did not stop"
        forget_fastapi_endpoints()
        return time.monotonic() - t


def forget_fastapi_endpoints() -> None:
    """Clear FastAPI's module-level lru_caches, which key on endpoint functions.

    Our endpoints are closures over the app's engine, so those caches (4096 entries each in
    fastapi 0.165) kept every stopped server's engine, model and KV cache alive: the suite's RSS
    grew by one engine per server started (issue 53 item 16). One app per process in production
    is harmless; a test session starts hundreds.
    """
    for name, mod in list(sys.modules.items()):
        if name == "fastapi" or name.startswith("fastapi."):
            for obj in list(vars(mod).values()):
                if callable(getattr(obj, "cache_clear", None)) and hasattr(obj, "cache_info"):
                    obj.cache_clear()


class SlowStep:
    """Wraps engine.step with a sleep so requests stay in flight long enough to observe."""

    def __init__(self, server: RunningServer, delay: float) -> None:
        self.engine, self.delay, self.inner = server.engine, delay, server.engine.step
        self.engine.step = self  # the engine thread looks the method up on every iteration

    def __call__(self) -> list:
        time.sleep(self.delay)
        return self.inner()

    def stop(self) -> None:
        """Restore the real step."""
        self.engine.step = self.inner


class FrozenCore:
    """SlowStep's counterpart for an engine core in its own process, where a slow front-end step
    still lets the core run MAX_UNCONSUMED_BATCHES steps ahead (the front end folds them into one):
    once a request runs, the core process is stopped (SIGSTOP) for `seconds`, then let go (SIGCONT).
    Inert in process."""

    def __init__(self, server: RunningServer, seconds: float = 1.0) -> None:
        self.thread: threading.Thread | None = None
        if server.engine.core_mode != "process":
            return
        (pid,) = server.engine.child_pids
        snapshot = lambda: server.state.async_engine.snapshot  # noqa: E731

        def hold() -> None:
            deadline = time.monotonic() + 10
            while snapshot().num_running == 0 and time.monotonic() < deadline:
                time.sleep(0.002)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)

        self.thread = threading.Thread(target=hold, daemon=True)
        self.thread.start()

    def join(self) -> None:
        """Wait until the core runs again."""
        if self.thread is not None:
            self.thread.join()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> float:
    """Poll cond until true (AssertionError after timeout); seconds waited."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not reached in {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - t0


def start_server(model_dir: Path, api_key: str | None = None, max_queued: int | None = None,
                 grace_s: float = 2.0, config_kw: dict[str, Any] | None = None,
                 **engine_kw: Any) -> RunningServer:
    """Build the engine and app and run uvicorn on a thread until /health answers."""
    import uvicorn

    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.engine import LLMEngine
    from twinserve.backends.real.serving.launch import GracefulServer
    from twinserve.backends.real.serving.server import ServerConfig, build_app

    args = dict(dtype="float64", max_model_len=256, num_gpu_blocks_override=256, block_size=4,
                max_num_batched_tokens=256, max_num_seqs=64)
    args.update(engine_kw)
    engine = LLMEngine(EngineArgs(model=str(model_dir), **args))
    app = build_app(engine, ServerConfig(["tiny"], api_key, max_queued, **(config_kw or {})))
    port = free_port()
    cfg = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                         timeout_graceful_shutdown=int(grace_s) + 5, access_log=False)
    server = GracefulServer(cfg, grace_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return RunningServer(url, app.state.serving, server, thread)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    server.should_exit = True
    raise RuntimeError("server did not come up within 30 s")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests/real tiny random-weight Llama with its byte-level BPE tokenizer."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("serving_tiny"))


@pytest.fixture(scope="module", params=["inproc", "process"])
def core_mode(request: pytest.FixtureRequest) -> str:
    """Every serving test runs with the engine core in this process and in its own."""
    return request.param


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, core_mode: str) -> Iterator[RunningServer]:
    """One shared server per test module (no API key)."""
    s = start_server(tiny_model_dir, engine_core_mode=core_mode)
    yield s
    s.stop()


@pytest.fixture
def make_server(tiny_model_dir: Path, core_mode: str) -> Iterator[Callable[..., RunningServer]]:
    """Factory for servers with special settings; all are stopped at the end of the test."""
    started: list[RunningServer] = []

    def build(**kw: Any) -> RunningServer:
        kw.setdefault("engine_core_mode", core_mode)
        s = start_server(tiny_model_dir, **kw)
        started.append(s)
        return s

    yield build
    for s in started:
        if s.thread.is_alive():
            s.stop()


def prometheus_series(text: str) -> dict[str, float]:
    """Sum of the values of each series name in a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
