"""`twinserve route`: two real CPU replicas behind the proxy, with the simulator's routers."""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest
import uvicorn

from twinserve.backends.real.serving.route_proxy import ProxyConfig, build_proxy_app
from twinserve.core.routing import RouterConfig

from .conftest import SlowStep, free_port, start_server, wait_for

pytestmark = pytest.mark.slow


class Proxy:
    """The proxy app on a free port, on a thread."""

    def __init__(self, urls: list[str], router: str, options: dict | None = None, **kw) -> None:
        self.app = build_proxy_app(ProxyConfig(urls, RouterConfig(router, options or {}),
                                               health_interval_s=0.2, **kw))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port,
                                                    log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 20)

    def routed(self) -> dict[str, float]:
        """requests_routed_total per replica URL, from the proxy's /metrics."""
        out = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith("twinserve_router:requests_routed_total{"):
                url = line.split('replica="', 1)[1].split('"', 1)[0]
                out[url] = float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)


@pytest.fixture(scope="module")
def replicas(tiny_model_dir):
    servers = [start_server(tiny_model_dir), start_server(tiny_model_dir)]
    yield servers
    for s in servers:
        if s.thread.is_alive():
            s.stop()


def complete(url: str, prompt: str, **kw) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0.0}
    body.update(kw)
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def test_round_robin_spreads_and_answers_like_a_replica(replicas) -> None:
    proxy = Proxy([s.url for s in replicas], "round_robin")
    try:
        direct = complete(replicas[0].url, "hello world").json()["choices"][0]["text"]
        answers = [complete(proxy.url, "hello world") for _ in range(4)]
        assert all(a.status_code == 200 for a in answers)
        assert {a.json()["choices"][0]["text"] for a in answers} == {direct}
        assert sorted(a.headers["x-twinserve-replica"] for a in answers) == ["0", "0", "1", "1"]
        assert proxy.routed() == {replicas[0].url: 2.0, replicas[1].url: 2.0}
        models = httpx.get(proxy.url + "/v1/models").json()
        assert models["data"][0]["id"] == "tiny"
        # A replica's own 400 passes through unchanged.
        bad = complete(proxy.url, "hi", max_tokens=-3)
        assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
    finally:
        proxy.stop()


def test_stream_passes_through_and_disconnect_aborts_upstream(replicas) -> None:
    proxy = Proxy([s.url for s in replicas], "least_outstanding")
    try:
        direct = complete(replicas[0].url, "stream me", max_tokens=12).json()["choices"][0]["text"]
        with httpx.stream("POST", proxy.url + "/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": "stream me", "max_tokens": 12,
                                "temperature": 0.0, "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
        assert text == direct
        # Slow both replicas, start a long stream, read one event and hang up.
        # 200 ms a step: the stream cannot end while the client reads its first event, even on a loaded
        # CI machine (at 50 ms it once did: the precondition below failed).
        slow = [SlowStep(s, 0.2) for s in replicas]
        try:
            with httpx.stream("POST", proxy.url + "/v1/completions", timeout=60,
                              json={"model": "tiny", "prompt": "long one", "max_tokens": 200,
                                    "ignore_eos": True, "stream": True}) as r:
                assert r.status_code == 200
                target = replicas[int(r.headers["x-twinserve-replica"])]
                first = next(line for line in r.iter_lines() if line.startswith("data: "))
                assert "error" not in json.loads(first[6:]), first
                assert target.engine.has_unfinished_requests(), first
            # 200 tokens at 200 ms a step would take 40 s; the abort frees it at once.
            waited = wait_for(lambda: not target.engine.has_unfinished_requests(), 5.0)
            assert waited < 5.0
        finally:
            for s in slow:
                s.stop()
        # The proxy's own books close too: nothing in flight on either replica.
        loads = proxy.app.state.proxy.loads
        wait_for(lambda: all(x.outstanding == 0 for x in loads), 5.0)
        gauges = [line for line in httpx.get(proxy.url + "/metrics").text.splitlines()
                  if line.startswith("twinserve_router:requests_in_flight{")]
        assert gauges and all(line.endswith(" 0.0") for line in gauges)
    finally:
        proxy.stop()


def test_prefix_affinity_keeps_a_shared_prefix_on_one_replica(replicas) -> None:
    proxy = Proxy([s.url for s in replicas], "prefix_affinity", prefix_chunk_chars=16,
                  options={"prefix_blocks": 2})
    try:
        system = "You are a terse assistant. " * 3
        homes = {complete(proxy.url, system + f"question {i}").headers["x-twinserve-replica"]
                 for i in range(4)}
        assert len(homes) == 1
    finally:
        proxy.stop()


def test_session_affinity_spreads_new_sessions_and_keeps_each_on_its_replica(replicas) -> None:
    proxy = Proxy([s.url for s in replicas], "session_affinity")
    try:
        homes: dict[str, set[str]] = {}
        for turn in range(3):
            for i in range(4):  # one request at a time: every replica is idle when a session starts
                sid = f"conversation-{i}"
                r = httpx.post(proxy.url + "/v1/completions", headers={"X-Session-ID": sid}, timeout=60,
                               json={"model": "tiny", "prompt": f"turn {turn}", "max_tokens": 2})
                assert r.status_code == 200
                homes.setdefault(sid, set()).add(r.headers["x-twinserve-replica"])
        assert all(len(h) == 1 for h in homes.values()), homes
        assert sorted(next(iter(h)) for h in homes.values()) == ["0", "0", "1", "1"]
    finally:
        proxy.stop()


def test_tokenizer_and_info_routes_pass_through(replicas) -> None:
    proxy = Proxy([s.url for s in replicas], "round_robin")
    try:
        tok = httpx.post(proxy.url + "/tokenize", json={"model": "tiny", "prompt": "hello world"}, timeout=30)
        direct = httpx.post(replicas[0].url + "/tokenize", json={"model": "tiny", "prompt": "hello world"})
        assert tok.status_code == 200 and tok.json() == direct.json()
        detok = httpx.post(proxy.url + "/detokenize", json={"model": "tiny", "tokens": tok.json()["tokens"]})
        assert detok.status_code == 200 and detok.json()["prompt"] == "hello world"
        bad = httpx.post(proxy.url + "/detokenize", json={"model": "tiny", "tokens": [10 ** 7]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
        assert httpx.get(proxy.url + "/version").json() == httpx.get(replicas[0].url + "/version").json()
        assert httpx.get(proxy.url + "/ping").status_code == 200
        assert httpx.post(proxy.url + "/ping").status_code == 200
    finally:
        proxy.stop()


def test_metrics_carry_each_replicas_series_labelled_by_replica(replicas) -> None:
    proxy = Proxy([s.url for s in replicas], "round_robin")
    try:
        for _ in range(2):
            assert complete(proxy.url, "count me").status_code == 200
        text = httpx.get(proxy.url + "/metrics").text
        for s in replicas:
            pattern = (r'twinserve:request_success_total\{finished_reason="length",model_name="tiny",'
                       rf'replica="{re.escape(s.url)}"\}} (\d+\.\d+)')
            hit = re.search(pattern, text)
            assert hit and float(hit.group(1)) >= 1.0, text[-2000:]
        assert text.count("# TYPE twinserve:num_requests_running gauge") == 1  # one family, both replicas
        assert "twinserve_router:requests_routed_total" in text
    finally:
        proxy.stop()


def test_a_replica_that_goes_down_leaves_rotation_and_errors_are_clear(tiny_model_dir) -> None:
    a, b = start_server(tiny_model_dir), start_server(tiny_model_dir)
    proxy = Proxy([a.url, b.url], "round_robin")
    try:
        assert complete(proxy.url, "x").status_code == 200
        b.stop()
        # Requests keep succeeding: the one sent to b is retried on a, and b leaves rotation.
        for _ in range(4):
            r = complete(proxy.url, "after b died")
            assert r.status_code == 200 and r.headers["x-twinserve-replica"] == "0"
        metrics = httpx.get(proxy.url + "/metrics").text
        assert f'twinserve_router:replica_healthy{{replica="{b.url}"}} 0.0' in metrics
        assert httpx.get(proxy.url + "/health").json() == {"replicas": 2, "healthy": 1}
        a.stop()
        r = complete(proxy.url, "nobody home")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "no_replica_available" and "out of rotation" in err["message"]
        assert httpx.get(proxy.url + "/health").status_code == 503
    finally:
        proxy.stop()
        for s in (a, b):
            if s.thread.is_alive():
                s.stop()


def _conversation(i: int, turns: int) -> dict:
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"hi, I am user {i}"}]
    for t in range(1, turns):
        msgs += [{"role": "assistant", "content": f"hello {i}, answer {t}" * 3},
                 {"role": "user", "content": f"follow-up {t} " * 5}]
    return {"model": "tiny", "messages": msgs}


def test_prefix_affinity_keeps_a_conversation_with_a_short_first_turn_on_its_replica() -> None:
    from twinserve.backends.real.serving.route_proxy import RouteProxy

    # The defaults: 4 chunks of 64 characters.
    proxy = RouteProxy(ProxyConfig([f"http://r{i}" for i in range(4)], RouterConfig("prefix_affinity")))
    homes = []
    for i in range(24):  # first turns well under 256 characters
        turns = [proxy.choose(_conversation(i, t), {}, set()) for t in (1, 2, 3)]
        assert len(set(turns)) == 1, (i, turns)
        homes.append(turns[0])
    assert len(set(homes)) > 1  # distinct conversations still spread over the replicas


def test_the_router_refuses_a_body_over_its_limit_with_413_before_forwarding(replicas) -> None:
    proxy = Proxy([s.url for s in replicas], "round_robin", max_request_body_bytes=4096)
    try:
        r = complete(proxy.url, "x" * 8192)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "request_too_large"
        assert sum(proxy.routed().values()) == 0  # never forwarded
        r = httpx.post(proxy.url + "/tokenize", json={"model": "tiny", "prompt": "y" * 8192}, timeout=60)
        assert r.status_code == 413
        assert complete(proxy.url, "small").status_code == 200
    finally:
        proxy.stop()
