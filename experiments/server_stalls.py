"""Stalls one request's stream while another request's big body is checked (issue 53 items 3 and 4).

Each server (this tree's, and with --baseline REV that revision's too) runs in a process of its own over
SmolLM2 (or --model); this script is only the client. A stream is read while each probe runs; printed per
probe and server: the stream's longest gap between chunks (median over --rounds, the servers taken in
turn within a round), that over the longest gap with no probe (1.0: no stall), the probe's status and
seconds, and for the batch of long prompts its time to the 400 over a single such prompt's.

Probe bodies are serialized before the stream starts, so the client's own JSON work is never in the gap.

    taskset -c 1 python experiments/server_stalls.py --baseline main
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
# The package's top-level folders (setup.py maps each onto twinserve.<folder>).
FOLDERS = ("core", "backends", "sim", "kernels", "twin", "bench")

SERVER = r'''
import sys, uvicorn, twinserve
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.engine import LLMEngine
from twinserve.backends.real.serving.server import ServerConfig, build_app
model, max_model_len, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("twinserve from", twinserve.__file__, flush=True)
engine = LLMEngine(EngineArgs(model=model, max_model_len=max_model_len, engine_core_mode="inproc"))
app = build_app(engine, ServerConfig(["m"], access_log=False))
uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")
'''


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkout(rev: str, into: Path) -> Path:
    """A revision's files laid out as the installed package (twinserve/ plus its top-level folders, linked):
    a PYTHONPATH entry that imports that revision as `twinserve`."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = into / "root" / "twinserve"
    pkg.mkdir(parents=True)
    for entry in (src / "twinserve").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for folder in FOLDERS:
        (pkg / folder).symlink_to(src / folder)
    return into / "root"


def start(model: str, max_model_len: int, pythonpath: Path | None) -> tuple[str, subprocess.Popen]:
    """A server process (this tree's, or the revision's on `pythonpath`); its URL once /health answers."""
    port = _port()
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(pythonpath)
    proc = subprocess.Popen([sys.executable, "-c", SERVER, model, str(max_model_len), str(port)], env=env,
                            cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        time.sleep(0.1)
    raise RuntimeError("server did not come up")


def gap_during(url: str, probe: tuple[str, bytes] | None) -> tuple[float, float, int]:
    """(longest gap between stream chunks, seconds the probe took, its status) with the probe run mid-stream."""
    gaps: list[float] = []
    started = threading.Event()

    def read() -> None:
        body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 100, "ignore_eos": True, "stream": True}
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
        path, raw = probe
        t0 = time.perf_counter()
        status = httpx.post(url + path, content=raw, headers={"content-type": "application/json"},
                            timeout=600).status_code
        took = time.perf_counter() - t0
    t.join()
    return max(gaps), took, status


def main() -> None:
    """Run the probes on each server in turn and print the medians and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="model the servers load")
    ap.add_argument("--max-model-len", type=int, default=8192, help="the servers' --max-model-len")
    ap.add_argument("--batch", type=int, default=100, help="prompts in the long-batch probe")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, servers taken in turn; medians reported")
    ap.add_argument("--baseline", default=None, help="a git revision whose server is measured too, in turn")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, model {args.model}, "
          f"{args.rounds} rounds")
    long_text = "the quick brown fox jumps over the lazy dog " * (96_000 // 44)
    ids = [100] * 2_000_000
    dump = lambda body: json.dumps(body).encode()  # noqa: E731
    one, batch = "1 prompt of 96k chars", f"batch of {args.batch} prompts of 96k chars"
    probes = {
        one: ("/v1/completions", dump({"model": "m", "prompt": long_text, "max_tokens": 1})),
        batch: ("/v1/completions", dump({"model": "m", "prompt": [long_text] * args.batch, "max_tokens": 1})),
        "/detokenize of 2M ids": ("/detokenize", dump({"model": "m", "tokens": ids})),
        "a 2M-id prompt": ("/v1/completions", dump({"model": "m", "prompt": ids, "max_tokens": 1})),
    }
    with tempfile.TemporaryDirectory() as tmp:
        sides: list[tuple[str, Path | None]] = []
        if args.baseline:
            sides.append((f"baseline {args.baseline}", checkout(args.baseline, Path(tmp))))
        sides.append(("working tree", None))
        servers = []
        try:
            for label, path in sides:
                servers.append((label, *start(args.model, args.max_model_len, path)))
            results: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
            for _ in range(args.rounds):
                for name, probe in [("idle", None), *probes.items()]:
                    for label, url, _proc in servers:
                        results.setdefault((label, name), []).append(gap_during(url, probe))
        finally:
            for _label, _url, proc in servers:
                proc.terminate()
                proc.wait()
    for label, _path in sides:
        med = {name: (statistics.median(r[0] for r in results[(label, name)]),
                      statistics.median(r[1] for r in results[(label, name)]),
                      sorted({r[2] for r in results[(label, name)]}))
               for name in ["idle", *probes]}
        idle = med["idle"][0]
        print(f"{label}: idle longest stream gap {idle * 1e3:.0f} ms")
        for name in probes:
            gap, took, status = med[name]
            print(f"  {name}: {status} in {took:.2f} s; longest stream gap {gap * 1e3:.0f} ms = "
                  f"{gap / idle:.1f}x idle")
        print(f"  time to the 400: batch of {args.batch} / one prompt = {med[batch][1] / med[one][1]:.1f}x")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
