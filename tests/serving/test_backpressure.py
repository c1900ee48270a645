"""A front end that falls behind holds the engine back instead of letting it run away.

Without backpressure the engine (a thread, or a core in its own process) keeps stepping while a
busy event loop has not yet dispatched its outputs: queued outputs grow without bound, and a
client that hangs up keeps its KV blocks and its compute until its request runs to the end.
"""

from __future__ import annotations

import threading
import time

import httpx

from .conftest import RunningServer, wait_for
from .test_load import scrape

LONG = 200


class BusyLoop:
    """Blocks the server's event loop for `block_s` at a time, over and over (a loaded front end)."""

    def __init__(self, server: RunningServer, block_s: float) -> None:
        self.loop = server.state.async_engine._loop
        self.block_s = block_s
        self.stopped = threading.Event()
        self.loop.call_soon_threadsafe(self._hog)

    def _hog(self) -> None:
        if self.stopped.is_set():
            return
        time.sleep(self.block_s)
        self.loop.call_later(0.001, self._hog)  # other callbacks run between two blocks

    def stop(self) -> None:
        """Let the loop run freely again."""
        self.stopped.set()


def test_a_hang_up_on_a_busy_front_end_is_aborted_not_run_to_the_end(make_server) -> None:
    server = make_server(max_num_seqs=8)
    kv = server.engine.core.scheduler.kv
    before = scrape(server.url)
    busy = BusyLoop(server, 0.05)
    try:
        body = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": LONG, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(4)]  # two chunks (data line + blank line each)
        assert got[0].startswith("data: ")
        wait_for(lambda: not server.engine.has_unfinished_requests() and kv.num_free_blocks == kv.num_blocks,
                 timeout=20)
    finally:
        busy.stop()
    after = scrape(server.url)
    generated = after["twinserve:generation_tokens_total{}"] - before.get("twinserve:generation_tokens_total{}", 0)
    aborted = after["twinserve:request_success_total{finished_reason=abort}"] - before.get(
        "twinserve:request_success_total{finished_reason=abort}", 0)
    # The engine ran at most a few steps past what the loop had dispatched when the client left.
    assert aborted == 1
    assert generated < LONG // 4, generated
    print(f"hung up on a busy front end after {generated:.0f} of {LONG} tokens")
