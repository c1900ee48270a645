"""The server through the official openai client: completions and chat, streamed and not."""

from __future__ import annotations

import httpx
import pytest

from .conftest import RunningServer

PROMPT = "the quick brown fox"
NO_EOS = {"ignore_eos": True}


def _prompt_len(server: RunningServer, text: str) -> int:
    return len(server.engine.tokenizer(text)["input_ids"])


def test_models_and_health(server: RunningServer) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_completion_non_streamed_usage_and_greedy_determinism(server: RunningServer) -> None:
    c = server.client()
    r = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, extra_body=NO_EOS)
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == _prompt_len(server, PROMPT)
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    again = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, extra_body=NO_EOS)
    assert again.choices[0].text == r.choices[0].text
    # A token-id prompt is the same request.
    ids = server.engine.tokenizer(PROMPT)["input_ids"]
    by_ids = c.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0, extra_body=NO_EOS)
    assert by_ids.choices[0].text == r.choices[0].text


def test_completion_streamed_deltas_equal_the_full_text(server: RunningServer) -> None:
    c = server.client()
    full = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, extra_body=NO_EOS)
    chunks = list(c.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body=NO_EOS))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    # include_usage: every chunk carries usage null, the last one carries the counts and no choices.
    assert all(ch.usage is None for ch in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == _prompt_len(server, PROMPT)


def test_streamed_without_include_usage_has_no_usage_chunk(server: RunningServer) -> None:
    chunks = list(server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=5, stream=True,
                                                     extra_body=NO_EOS))
    assert all(ch.choices for ch in chunks)
    assert all(getattr(ch, "usage", None) is None for ch in chunks)


def test_raw_sse_framing_ends_with_done(server: RunningServer) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


def test_chat_non_streamed_and_streamed(server: RunningServer) -> None:
    c = server.client()
    messages = [{"role": "user", "content": "hello there"}]
    expected_prompt = len(server.engine.chat_prompt(messages)["prompt_token_ids"])
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, extra_body=NO_EOS)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == expected_prompt and r.usage.completion_tokens == 10
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body=NO_EOS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].delta.role is None for ch in chunks[1:] if ch.choices)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].usage.prompt_tokens == expected_prompt


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_is_honoured(server: RunningServer, stream: bool) -> None:
    c = server.client()
    full = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0,
                                extra_body=NO_EOS).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    assert len(stop) == 2
    expected = full[:full.index(stop)]
    if stream:
        chunks = list(c.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop],
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body=NO_EOS))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        usage = chunks[-1].usage
    else:
        r = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                 extra_body=NO_EOS)
        text, finish, usage = r.choices[0].text, [r.choices[0].finish_reason], r.usage
    assert text == expected and stop not in text
    assert finish == ["stop"]
    assert usage.completion_tokens < 40


def test_n_choices_and_seeded_sampling(server: RunningServer) -> None:
    c = server.client()
    r = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=7,
                             extra_body=NO_EOS)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 24
    again = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=7,
                                 extra_body=NO_EOS)
    assert [ch.text for ch in again.choices] == [ch.text for ch in r.choices]
    chunks = list(c.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=7,
                                       stream=True, extra_body=NO_EOS))
    texts = {i: "".join(ch.choices[0].text for ch in chunks if ch.choices[0].index == i) for i in range(3)}
    assert [texts[i] for i in range(3)] == [ch.text for ch in r.choices]


def test_eos_ends_a_request_with_stop(server: RunningServer) -> None:
    eos = server.engine.tokenizer.eos_token_id
    r = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0,
                                           extra_body={"stop_token_ids": [eos], "min_tokens": 0})
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 30


def test_metrics_exposes_vllm_names_under_our_prefix(server: RunningServer) -> None:
    text = httpx.get(server.url + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries_total", "prefix_cache_hits_total", "num_preemptions_total",
                 "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
                 "e2e_request_latency_seconds_count", "request_queue_time_seconds_sum",
                 "prompt_tokens_total", "generation_tokens_total"):
        assert f"twinserve:{name}{{" in text, name
