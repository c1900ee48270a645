"""Stalls one request's stream while another request's big body is checked (issue 53 items 3 and 4).

The server runs in this process (uvicorn on a thread) over SmolLM2 (or --model). A stream is read while
each probe runs; printed: the stream's longest gap between chunks over its longest idle gap (1.0: no
stall), and for the batch of long prompts its time to the 400 over a single such prompt's.

    taskset -c 1 python experiments/server_stalls.py
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time

import httpx


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, max_model_len: int) -> str:
    """The server on a thread; its URL once /health answers."""
    import uvicorn

    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.engine import LLMEngine
    from twinserve.backends.real.serving.server import ServerConfig, build_app

    engine = LLMEngine(EngineArgs(model=model, max_model_len=max_model_len, engine_core_mode="inproc"))
    app = build_app(engine, ServerConfig(["m"], access_log=False))
    port = _port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not come up")


def gap_during(url: str, probe) -> tuple[float, float, int]:
    """(longest gap between stream chunks, seconds the probe took, its status) with the probe run mid-stream."""
    gaps: list[float] = []
    started = threading.Event()

    def read() -> None:
        body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
            last = None
            for _ in r.iter_lines():
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
                started.set()

    t = threading.Thread(target=read)
    t.start()
    started.wait(60)
    time.sleep(0.3)
    took, status = 0.0, 0
    if probe is not None:
        t0 = time.perf_counter()
        status = probe()
        took = time.perf_counter() - t0
    t.join()
    return max(gaps), took, status


def main() -> None:
    """Run the probes and print the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, model {args.model}")
    url = start(args.model, args.max_model_len)
    long_text = "the quick brown fox jumps over the lazy dog " * (96_000 // 44)
    ids = [100] * 2_000_000
    post = lambda path, body: httpx.post(url + path, json=body, timeout=600).status_code  # noqa: E731
    probes = {
        "1 prompt of 96k chars": lambda: post("/v1/completions", {"model": "m", "prompt": long_text, "max_tokens": 1}),
        f"batch of {args.batch} prompts of 96k chars": lambda: post(
            "/v1/completions", {"model": "m", "prompt": [long_text] * args.batch, "max_tokens": 1}),
        "/detokenize of 2M ids": lambda: post("/detokenize", {"model": "m", "tokens": ids}),
        "a 2M-id prompt": lambda: post("/v1/completions", {"model": "m", "prompt": ids, "max_tokens": 1}),
    }
    idle, _, _ = gap_during(url, None)
    print(f"idle: longest stream gap {idle * 1e3:.0f} ms")
    took = {}
    for name, probe in probes.items():
        gap, took[name], status = gap_during(url, probe)
        print(f"{name}: {status} in {took[name]:.2f} s; longest stream gap {gap * 1e3:.0f} ms = {gap / idle:.1f}x idle")
    one, many = took["1 prompt of 96k chars"], took[f"batch of {args.batch} prompts of 96k chars"]
    print(f"time to the 400: batch of {args.batch} / one prompt = {many / one:.1f}x")


if __name__ == "__main__":
    main()
