"""A fault inside an engine step (the core raises; in process mode, in its own process): every
request in flight ends with an error (a stream ends, a plain request gets a 5xx) within seconds,
the server reports 503 from then on, and nothing hangs.

The fault is planted past the front end's validation, at the seam to the engine core: a prompt
token id outside the vocabulary makes the step's embedding lookup raise (IndexError), as a bug in
the model runner would.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .conftest import wait_for


def _plant(engine) -> list[bool]:
    """The next request added reaches the core with an id outside the vocabulary; returns the trigger."""
    armed: list[bool] = []
    add = engine.core.add_request

    def add_request(req):
        if armed:
            armed.clear()
            req.prompt_token_ids = [*req.prompt_token_ids[:-1], 10 ** 6]  # what crosses to the core process
            req.all_token_ids[-1] = 10 ** 6  # what an in-process core reads
        add(req)
    engine.core.add_request = add_request
    return armed


@pytest.mark.timeout(120)
def test_a_step_that_raises_fails_the_requests_in_flight_and_the_server_says_503(make_server, core_mode) -> None:
    s = make_server()
    armed = _plant(s.engine)
    lines: list[str] = []
    ended: list[BaseException | None] = []

    def stream() -> None:
        try:
            with httpx.stream("POST", s.url + "/v1/completions", timeout=60, json={
                    "model": "tiny", "prompt": "the quick brown", "max_tokens": 200, "stream": True,
                    "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    lines.append(line)
            ended.append(None)
        except BaseException as e:  # a cut connection is an acceptable end too
            ended.append(e)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    wait_for(lambda: len([ln for ln in lines if ln.startswith("data:")]) >= 3, timeout=60)
    armed.append(True)
    t0 = time.monotonic()
    r = httpx.post(s.url + "/v1/completions", timeout=15,
                   json={"model": "tiny", "prompt": "hello there", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code in (500, 503), r.text
    assert "IndexError" in r.text or "engine" in r.json()["error"]["message"].lower(), r.text
    t.join(15)
    assert not t.is_alive(), "the stream in flight did not end"
    assert time.monotonic() - t0 < 15
    body = "\n".join(lines)
    assert ended[0] is not None or '"error"' in body, body[-800:]
    assert "[DONE]" not in body or '"error"' in body  # never a clean end for a request the engine lost
    waited = wait_for(lambda: httpx.get(s.url + "/health", timeout=5).status_code == 503, timeout=10)
    assert waited < 10
    r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}, timeout=10)
    assert r.status_code == 503
    assert s.stop() < 30
