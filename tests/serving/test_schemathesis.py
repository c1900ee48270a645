"""schemathesis against the server's own OpenAPI document: every response is documented, none is a 5xx.

Bounded: a tiny model with a 64-token context, n at most 4, and a fixed number of examples per
operation, so the whole run takes well under a minute. The engine must still answer afterwards.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from .conftest import RunningServer, start_server, wait_for

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import checks  # noqa: E402

_CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
           checks.response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir) -> Iterator[RunningServer]:
    """A server with small bounds so generated requests stay cheap."""
    s = start_server(tiny_model_dir, max_model_len=64, config_kw={"max_n": 4, "max_request_body_bytes": 65536})
    yield s
    s.stop()


# Every operation the server serves; negative data (wrong types, missing fields) where there is a body.
POSTS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
GETS = ["/v1/models", "/health", "/metrics", "/version", "/ping"]
OPERATIONS = [(p, "POST", mode) for p in POSTS for mode in ("positive", "negative")] + \
    [(p, "GET", "positive") for p in GETS]


def test_the_document_covers_every_route(fuzz_server: RunningServer) -> None:
    doc = httpx.get(fuzz_server.url + "/openapi.json", timeout=10).json()
    listed = {(path, m.upper()) for path, ops in doc["paths"].items() for m in ops}
    assert {(p, "POST") for p in POSTS} | {(p, "GET") for p in GETS} <= listed
    for path in POSTS:
        assert "requestBody" in doc["paths"][path]["post"], path
STATUSES: Counter[int] = Counter()


@pytest.mark.parametrize("path,method,mode", OPERATIONS)
def test_every_response_is_documented_and_never_5xx(fuzz_server: RunningServer, path: str, method: str,
                                                    mode: str) -> None:
    api = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operation = api[path][method]
    examples = 150 if method == "POST" else 5

    @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode(mode)))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(case) -> None:
        response = case.call_and_validate(base_url=fuzz_server.url, checks=_CHECKS, timeout=60)
        STATUSES[response.status_code] += 1

    fuzz()


def test_engine_survives_the_fuzzing(fuzz_server: RunningServer) -> None:
    # The fuzzing reached the engine (some 200s), and was refused where it should be (some 400s).
    assert STATUSES[200] > 10 and STATUSES[400] > 10, STATUSES
    r = httpx.post(fuzz_server.url + "/v1/completions",
                   json={"model": "tiny", "prompt": "the lazy dog", "max_tokens": 3, "ignore_eos": True}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    wait_for(lambda: fuzz_server.state.async_engine.snapshot.num_unfinished == 0, timeout=30)
    snap = fuzz_server.state.async_engine.snapshot
    assert snap.num_running == 0 and snap.num_free_blocks == snap.num_blocks
