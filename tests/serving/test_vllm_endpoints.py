"""vLLM's extra endpoints (/tokenize, /detokenize, /version, /ping), the access log, and vLLM metric names."""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest

from .conftest import RunningServer, prometheus_series, wait_for

PROMPT = "the quick brown fox jumps"


def test_tokenize_round_trips_through_detokenize(server: RunningServer) -> None:
    r = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": PROMPT, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = server.engine.tokenizer(PROMPT)["input_ids"]
    assert body["tokens"] == ids and body["count"] == len(ids)
    assert body["max_model_len"] == server.engine.max_model_len
    assert body["token_strs"] == server.engine.tokenizer.convert_ids_to_tokens(ids)
    back = httpx.post(server.url + "/detokenize", json={"model": "tiny", "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": PROMPT}


def test_tokenize_chat_messages_matches_the_chat_template(server: RunningServer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    r = httpx.post(server.url + "/tokenize", json={"messages": messages})
    assert r.status_code == 200, r.text
    expected = server.engine.chat_prompt(messages)["prompt_token_ids"]
    assert r.json()["tokens"] == expected and r.json()["token_strs"] is None
    # Without the generation prompt the rendering is shorter, and a chat completion bills the same count.
    bare = httpx.post(server.url + "/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert bare.json()["count"] < len(expected)
    chat = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == len(expected)
    text = httpx.post(server.url + "/detokenize", json={"tokens": expected}).json()["prompt"]
    assert "hello there" in text


@pytest.mark.parametrize("path,body,param", [
    ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"model": "nope", "prompt": "x"}, "model"),
])
def test_tokenizer_endpoints_refuse_bad_bodies(server: RunningServer, path: str, body: dict, param: str) -> None:
    r = httpx.post(server.url + path, json=body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_version_and_ping(server: RunningServer) -> None:
    from twinserve import __version__

    assert httpx.get(server.url + "/version").json() == {"version": __version__}
    assert httpx.get(server.url + "/ping").status_code == 200
    assert httpx.post(server.url + "/ping").status_code == 200


def _access_lines(caplog: pytest.LogCaptureFixture, paths: tuple[str, ...] = ()) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "twinserve.access"]
    # A line of the previous test's last request can be written after this test began capturing.
    return [x for x in lines if any(f" {p}\" " in x for p in paths)] if paths else lines


def test_access_log_one_line_per_request_with_id_status_and_error(server: RunningServer,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="twinserve.access")
    ok = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
    bad = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "top_p": 7})
    missing = httpx.get(server.url + "/no/such/route")
    assert (ok.status_code, bad.status_code, missing.status_code) == (200, 400, 404)
    # The line is written once the last body byte is sent, which may be just after the client has it.
    own = ("/v1/completions", "/no/such/route")
    wait_for(lambda: len(_access_lines(caplog, own)) >= 3)
    lines = _access_lines(caplog, own)
    assert len(lines) == 3, lines
    rid = ok.json()["id"].removeprefix("cmpl-")
    assert ok.headers["x-request-id"] == rid
    assert re.fullmatch(rf'127\.0\.0\.1:\d+ "POST /v1/completions" 200 \d+\.\dms request_id={rid}', lines[0])
    assert '"POST /v1/completions" 400' in lines[1] and "top_p" in lines[1] and "error=" in lines[1]
    assert bad.json()["error"]["message"] in lines[1].replace('\\"', '"')
    assert '"GET /no/such/route" 404' in lines[2] and "Not Found" in lines[2]


def test_access_log_keeps_the_client_request_id_and_times_streams_to_the_end(
        server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="twinserve.access")
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers={"X-Request-Id": "abc-1"}) as r:
        assert r.headers["x-request-id"] == "abc-1"
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    wait_for(lambda: len(_access_lines(caplog)) >= 1)
    (line,) = _access_lines(caplog)
    assert " 200 " in line and 'x_request_id="abc-1"' in line


def test_a_client_request_id_cannot_forge_fields_of_the_access_line(
        server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    # The header is the client's: spaces in it must not read as more fields (status, user) to a log parser.
    caplog.set_level(logging.INFO, logger="twinserve.access")
    forged = "abc 200 0.1ms user=admin" + "x" * 600
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1},
                   headers={"X-Request-Id": forged})
    assert r.status_code == 200 and r.headers["x-request-id"] == forged
    wait_for(lambda: len(_access_lines(caplog)) >= 1)
    (line,) = _access_lines(caplog)
    head, _, tail = line.partition(" x_request_id=")
    value, end = json.JSONDecoder().raw_decode(tail)
    assert value == forged[:256] and tail[end:] == ""
    assert " user=" not in head and " user=" not in tail[end:]


def test_access_log_can_be_turned_off(make_server, caplog: pytest.LogCaptureFixture) -> None:
    s = make_server(config_kw={"access_log": False})
    caplog.set_level(logging.INFO, logger="twinserve.access")
    assert httpx.post(s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}).status_code == 200
    assert httpx.post(s.url + "/v1/completions", json={"prompt": PROMPT, "n": 0}).status_code == 400
    assert httpx.get(s.url + "/version").status_code == 200
    assert _access_lines(caplog) == []


# Every series vLLM's published Grafana dashboard queries
# (vllm-project/vllm, examples/observability/prometheus_grafana/grafana.json).
VLLM_DASHBOARD_SERIES = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds_bucket", "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:kv_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
]


def test_metrics_prefix_vllm_feeds_every_series_of_vllms_dashboard(make_server) -> None:
    s = make_server(config_kw={"metrics_prefix": "vllm"})
    r = s.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=5, n=2,
                                      extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 10
    series = prometheus_series(httpx.get(s.url + "/metrics").text)
    missing = [name for name in VLLM_DASHBOARD_SERIES if name not in series]
    assert missing == []
    assert not any(name.startswith("twinserve:") for name in series)
    assert series["vllm:generation_tokens_total"] == 10
    assert series["vllm:request_success_total"] == 1
    assert series["vllm:request_max_num_generation_tokens_sum"] == 5
    assert series["vllm:prompt_tokens_total"] == len(s.engine.tokenizer(PROMPT)["input_ids"])
    assert 'model_name="tiny"' in httpx.get(s.url + "/metrics").text
