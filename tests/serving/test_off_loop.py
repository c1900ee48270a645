"""Large bodies never hold the event loop or the large-text tokenizer lane (issue 53 items 2-4).

Each test puts a probe where the heavy work runs and asks whether it ran on the event loop
thread (a running asyncio loop there means every other stream waits for it), whether a call that
keeps the GIL to its end (json.loads, pydantic's validation, the tokenizer backend's decode) was
handed a whole long id list (a worker thread does not hide that from the loop), or in what order
the one large-text worker took its jobs. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from twinserve.backends.real.serving import info_routes, protocol, request_body
from twinserve.backends.real.serving.route_proxy import ProxyConfig, build_proxy_app
from twinserve.core.routing import RouterConfig

from .conftest import RunningServer, start_server

# Bodies this large are past request_body.INLINE_PARSE_BYTES (64 KiB): their work must leave the loop.
MANY_IDS = 50_000


def _on_event_loop() -> bool:
    """True when called on a thread that is running an asyncio loop (the server's event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture(scope="module")
def srv(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """Where the front end runs its work does not depend on the core mode: one server in process."""
    s = start_server(tiny_model_dir, engine_core_mode="inproc")
    yield s
    s.stop()


def _big(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_big(v) for v in value.values())
    return isinstance(value, list) and len(value) >= MANY_IDS


def _recording(inner: Callable[..., Any], seen: list[tuple[bool, bool]]) -> Callable[..., Any]:
    def probe(model: Any, body: Any, *a: Any, **kw: Any) -> Any:
        if isinstance(body, dict) and body.get("model") == "tiny-probe":
            seen.append((_on_event_loop(), _big(body)))  # (on the loop?, handed the whole id list?)
        return inner(model, body, *a, **kw)
    return probe


def test_token_id_bodies_are_validated_off_the_event_loop(srv: RunningServer, monkeypatch) -> None:
    """Item 4: a request model's validation runs on a worker thread, and never walks a long token-id list
    (pydantic holds the GIL for its whole call: 0.1 s per 2M ids, which a worker thread does not hide)."""
    seen: list[tuple[bool, bool]] = []
    monkeypatch.setattr(protocol, "parse_model", _recording(protocol.parse_model, seen))
    monkeypatch.setattr(info_routes, "parse_model", _recording(info_routes.parse_model, seen))
    srv.state.accepted_names.add("tiny-probe")
    try:
        ids = [5] * MANY_IDS
        r = httpx.post(srv.url + "/detokenize", json={"model": "tiny-probe", "tokens": ids}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["prompt"] == srv.engine.tokenizer.decode(ids)  # every id reached the decoder
        r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny-probe", "prompt": ids, "max_tokens": 1},
                       timeout=60)
        assert r.status_code == 400, r.text  # over max_model_len: refused, after validation
        assert r.json()["error"]["param"] == "prompt"
        assert f"has {MANY_IDS} tokens" in r.json()["error"]["message"]  # counted whole, not the validator's view
        # A long id list that fits once truncated: the engine gets the list's real tail.
        tail = [7, 8, 9, 10, 11, 12]
        body = {"model": "tiny-probe", "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
        r = httpx.post(srv.url + "/v1/completions", json={**body, "prompt": ids + tail,
                                                          "truncate_prompt_tokens": len(tail)}, timeout=60)
        short = httpx.post(srv.url + "/v1/completions", json={**body, "prompt": tail}, timeout=60)
        assert r.status_code == 200 and short.status_code == 200, (r.text, short.text)
        assert r.json()["choices"][0]["text"] == short.json()["choices"][0]["text"]
        assert r.json()["usage"]["prompt_tokens"] == len(tail)
        bad = httpx.post(srv.url + "/detokenize", json={"model": "tiny-probe", "tokens": ids + [-1]}, timeout=60)
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
    finally:
        srv.state.accepted_names.discard("tiny-probe")
    assert len(seen) == 5
    assert [seen[i][0] for i in (0, 1, 2, 4)] == [False] * 4  # the long bodies: off the loop
    assert not any(whole for _, whole in seen)  # and no validator walked their ids


def test_a_long_detokenized_text_is_rendered_off_the_event_loop(srv: RunningServer, monkeypatch) -> None:
    """Item 4: /detokenize's answer (megabytes for 2M ids) is serialized on the worker that decoded it."""
    from fastapi.responses import JSONResponse

    seen: list[bool] = []
    inner = JSONResponse.render

    def render(self: Any, content: Any) -> bytes:
        if isinstance(content, dict) and len(content.get("prompt") or "") >= MANY_IDS:
            seen.append(_on_event_loop())
        return inner(self, content)

    monkeypatch.setattr(JSONResponse, "render", render)
    r = httpx.post(srv.url + "/detokenize", json={"model": "tiny", "tokens": [5] * MANY_IDS}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == srv.engine.tokenizer.decode([5] * MANY_IDS)
    assert seen == [False]


def test_a_batch_leaves_the_large_text_lane_to_other_requests_between_its_prompts(
        srv: RunningServer, monkeypatch) -> None:
    """Item 3: a batch's prompts are separate jobs on the one large-text worker, so a request that
    arrives while the batch's first prompt is being tokenized is served before the batch's second."""
    pool = srv.state.tokenizers
    monkeypatch.setattr(pool, "large_job_chars", 64)  # these prompts all go to the large-text worker
    batch = [f"{word} " * 20 for word in ("alpha", "bravo", "charlie")]
    single = "delta " * 20
    order: list[str] = []
    single_queued = threading.Event()
    inner_run, inner_encode = pool.run, pool.encode

    async def run(size: int, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if order:  # the batch's first prompt holds the worker: a job handed over now is the single's
            single_queued.set()  # set on the loop just before the job goes to the worker
        return await inner_run(size, fn, *args, **kw)

    def encode(tok: Any, text: str, *args: Any, **kw: Any) -> Any:
        order.append(text)
        if text == batch[0]:  # hold the worker until the other request has queued its job
            assert single_queued.wait(30), "the single request never reached the tokenizer"
        return inner_encode(tok, text, *args, **kw)

    monkeypatch.setattr(pool, "run", run)
    monkeypatch.setattr(pool, "encode", encode)
    replies: dict[str, httpx.Response] = {}

    def post(name: str, prompt: Any) -> None:
        replies[name] = httpx.post(srv.url + "/v1/completions",
                                   json={"model": "tiny", "prompt": prompt, "max_tokens": 1}, timeout=60)

    t = threading.Thread(target=post, args=("batch", batch))
    t.start()
    for _ in range(3000):
        if order:
            break
        threading.Event().wait(0.01)
    assert order == [batch[0]]
    post("single", single)
    t.join(60)
    assert replies["batch"].status_code == 200, replies["batch"].text
    assert replies["single"].status_code == 200, replies["single"].text
    assert order == [batch[0], single, batch[1], batch[2]]


def test_the_router_parses_a_large_body_with_the_servers_decoder_off_its_event_loop(monkeypatch) -> None:
    """Item 2: the router decodes bodies as the server does (request_body's decoder, its depth and
    surrogate checks and sliced id arrays included), on a worker thread once they are large."""
    seen: list[bool] = []
    inner = request_body._decode

    def probe(raw: bytes) -> Any:
        if len(raw) > request_body.INLINE_PARSE_BYTES:
            seen.append(_on_event_loop())
        return inner(raw)

    monkeypatch.setattr(request_body, "_decode", probe, raising=False)  # main: the router had its own parse
    with socket.socket() as s:  # a replica nobody listens on: the request fails after it is parsed
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    app = build_proxy_app(ProxyConfig([dead], RouterConfig("prefix_affinity"), health_interval_s=60))
    body = json.dumps({"model": "tiny", "prompt": "fox " * 40_000, "max_tokens": 1})
    with TestClient(app) as client:
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 503, r.text  # parsed, routed, no replica reachable
        r = client.post("/v1/completions", content=b"[" * 100_000, headers={"content-type": "application/json"})
        assert r.status_code == 503, r.text  # too deep for the decoder: routed without keys, not a crash
    assert seen == [False, False]


class _CountingJson:
    """Stands in for the json module inside request_body: records the size of every loads() input."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def loads(self, raw: Any, **kw: Any) -> Any:
        self.sizes.append(len(raw))
        return json.loads(raw, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


IDS = list(range(-3, 120_000))
WELL_FORMED = [
    {"model": "m", "prompt": IDS},
    {"prompt": [IDS, [1, 2, 3], IDS[:5000]], "user": "[1, 2, 3]"},
    {"tokens": IDS, "nested": {"deeper": [0, IDS, "x"]}},
    [IDS],
    {"prompt": "[" + ",".join(map(str, IDS[:20_000])) + "]"},  # an id array inside a string stays a string
    {"prompt": [IDS[:3000]] * 40, "stop": ["]", "["]},
]


@pytest.mark.parametrize("sep", [(",", ":"), (", ", ": ")])
@pytest.mark.parametrize("body", range(len(WELL_FORMED)))
def test_long_id_arrays_decode_as_json_loads_does_a_slice_at_a_time(body: int, sep: tuple[str, str],
                                                                    monkeypatch) -> None:
    """Item 4: json.loads holds the GIL for its whole call (0.3 s per 10 MB of ids), so a long integer array
    is decoded in slices: the same value as one json.loads, and no decoder call handed the whole array."""
    raw = json.dumps(WELL_FORMED[body], separators=sep).encode()
    counting = _CountingJson()
    monkeypatch.setattr(request_body, "json", counting)
    assert request_body.decode_json(raw) == json.loads(raw)
    if body != 4:  # the string one falls back to one whole parse, which is right for it
        assert max(counting.sizes) < len(raw) // 4  # slices (64 KiB) and the rest, never the whole array


MALFORMED = [
    b'{"p": [' + b",".join([b"1"] * 40_000) + b",]}",  # trailing comma
    b'{"p": [' + b",".join([b"1"] * 40_000) + b",,2]}",
    b'{"p": [' + b",".join([b"01"] * 40_000) + b"]}",  # leading zeros
    b'{"p": [' + b" ".join([b"1"] * 40_000) + b"]}",  # no commas
    b'{"p": [' + b",".join([b"1"] * 40_000) + b"] x",
    b'{"p": [' + b",".join([b"1"] * 40_000),  # never closed
    b'{"p": [' + b",".join([b"-"] * 40_000) + b"]}",
]


@pytest.mark.parametrize("raw", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_long_id_array_is_the_400_json_loads_would_give(raw: bytes) -> None:
    with pytest.raises(ValueError) as plain:
        json.loads(raw)
    with pytest.raises(request_body.APIError) as err:
        request_body.decode_json(raw)
    assert err.value.status == 400
    assert str(plain.value) in err.value.body()["error"]["message"]


class _Backend:
    """A fast tokenizer's Rust backend, its calls recorded."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if callable(attr):
            def call(*a: Any, **kw: Any) -> Any:
                self.calls.append(name)
                return attr(*a, **kw)
            return call
        return attr


def test_detokenizing_uses_the_backend_call_that_lets_go_of_the_gil(srv: RunningServer) -> None:
    """Item 4: the Rust backend's decode keeps the GIL for its whole call (0.44 s for 2M ids), so
    /detokenize decodes through decode_batch, which releases it, and gets the same text."""
    from twinserve.backends.real.serving.tokenize_pool import decode_ids

    tok = copy.deepcopy(srv.engine.tokenizer)
    assert not tok.clean_up_tokenization_spaces  # the case the batch call stands in for
    ids = [i % 500 for i in range(3 * MANY_IDS)]
    expected = tok.decode(ids)
    tok._tokenizer = backend = _Backend(tok._tokenizer)
    assert decode_ids(tok, ids) == expected
    assert backend.calls == ["decode_batch"]
