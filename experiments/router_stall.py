"""How long one large body stalls every other stream through `twinserve route` (issue 53 item 2).

A fake replica (no model: it streams a chunk every 5 ms) runs in one process, the router in another,
this script is the client. A stream is read through the router while a large body is posted; the
figure is the stream's longest gap between chunks over its longest gap with no large body (1.0: no
stall). --baseline REV (repeatable) runs the router of that git revision too, in the same run, the routers
taken in turn for each body, --rounds times (medians printed), for a before/after.

    taskset -c 1 python experiments/router_stall.py --baseline main
"""

from __future__ import annotations

import argparse
import importlib.util
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

REPLICA = r'''
import asyncio, sys, uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
app = FastAPI()
@app.get("/health")
async def health(): return Response(status_code=200)
@app.get("/metrics")
async def metrics(): return Response("", media_type="text/plain")
@app.post("/v1/completions")
async def completions(request: Request):
    raw = await request.body()
    if b'"stream":true' not in raw[:200].replace(b' ', b''):
        return JSONResponse({"status": 400 if len(raw) > 1_000_000 else 200})
    async def ticks():
        for i in range(int(sys.argv[2])):
            yield f"data: {i}\n\n"
            await asyncio.sleep(0.005)
    return StreamingResponse(ticks(), media_type="text/event-stream")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
'''

ROUTER = r'''
import importlib.util, sys, uvicorn
spec = importlib.util.spec_from_file_location("router_under_test", sys.argv[2])
mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)
# ProxyConfig takes a RouterConfig since the routers' options; older revisions took the policy's name.
router = mod.RouterConfig(sys.argv[4]) if hasattr(mod, "RouterConfig") else sys.argv[4]
app = mod.build_proxy_app(mod.ProxyConfig([sys.argv[3]], router, health_interval_s=0.5))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
'''


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str) -> None:
    for _ in range(400):
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def _stream_gap(url: str, during: bytes | None) -> tuple[float, float]:
    """Longest gap (s) between stream chunks, with `during` posted meanwhile; and that post's seconds."""
    gaps: list[float] = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream("POST", url + "/v1/completions", json={"stream": True}, timeout=120) as r:
            if r.status_code != 200:
                raise RuntimeError(f"stream: {r.status_code} {r.read()[:300]!r}")
            last = time.perf_counter()
            for _ in r.iter_raw():
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
                started.set()

    t = threading.Thread(target=read)
    t.start()
    started.wait(30)
    time.sleep(0.1)
    took = 0.0
    if during is not None:
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/completions", content=during, headers={"content-type": "application/json"},
                       timeout=120)
        took = time.perf_counter() - t0
        print(f"    large body: {len(during) / 1e6:.0f} MB -> {r.status_code} in {took:.2f} s")
    t.join()
    return max(gaps[1:]), took


def measure(routers: list[tuple[str, Path]], sizes_mb: list[int], policy: str, rounds: int) -> None:
    """Start a replica and a router per revision, then take the routers in turn for each body size,
    `rounds` times; print the median gap ratios."""
    procs = []
    urls = []
    try:
        for _label, router_file in routers:
            rep_port, rt_port = _port(), _port()
            procs.append(subprocess.Popen([sys.executable, "-c", REPLICA, str(rep_port), "400"]))
            procs.append(subprocess.Popen([sys.executable, "-c", ROUTER, str(rt_port), str(router_file),
                                           f"http://127.0.0.1:{rep_port}", policy], cwd=tempfile.gettempdir()))
            _wait(f"http://127.0.0.1:{rep_port}/health")
            urls.append(f"http://127.0.0.1:{rt_port}")
            _wait(urls[-1] + "/health")
        # A completions body whose prompt is token ids: parsing it is the router's work.
        bodies = {mb: ('{"model": "m", "prompt": [' + ",".join(["12345"] * (mb * 1_000_000 // 6))
                       + '], "max_tokens": 1}').encode() for mb in sizes_mb}
        gaps: dict[tuple[int, int | None], list[float]] = {}
        for _ in range(rounds):
            for mb in [None, *sizes_mb]:
                for k, url in enumerate(urls):
                    gaps.setdefault((k, mb), []).append(_stream_gap(url, bodies.get(mb))[0])
        for k, (label, _file) in enumerate(routers):
            idle = statistics.median(gaps[(k, None)])
            print(f"{label}, {policy}: idle longest gap {idle * 1e3:.1f} ms (median of {rounds})")
            for mb in sizes_mb:
                gap = statistics.median(gaps[(k, mb)])
                print(f"    {mb} MB body: longest gap {gap * 1e3:.0f} ms = {gap / idle:.1f}x idle")
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def main() -> None:
    """Parse flags, measure the current router and the baseline revisions' in turn."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", action="append", default=[],
                    help="a git revision whose router is measured too (repeatable)")
    ap.add_argument("--sizes-mb", default="10,60", help="body sizes in MB, comma-separated")
    ap.add_argument("--policies", default="round_robin,prefix_affinity",
                    help="router policies to measure, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, routers taken in turn; medians reported")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes_mb.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    rel = "backends/real/serving/route_proxy.py"
    routers = []
    for rev in args.baseline:
        src = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(src)
        routers.append((f"baseline {rev}", Path(f.name)))
    routers.append(("working tree", ROOT / rel))
    for policy in args.policies.split(","):
        measure(routers, sizes, policy, args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
