"""A batch of prompts on /v1/completions, as OpenAI, vLLM and lm-eval's local-completions send it."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import RunningServer, wait_for

PROMPTS = ["the quick brown fox", "hello there", "a b c d e f"]
NO_EOS = {"ignore_eos": True}


def _single(server: RunningServer, prompt: str | list[int], **kw) -> list[str]:
    r = server.client().completions.create(model="tiny", prompt=prompt, extra_body=NO_EOS, **kw)
    return [c.text for c in sorted(r.choices, key=lambda c: c.index)]


def test_batch_of_strings_indexes_choices_by_prompt_then_n_and_sums_usage(server: RunningServer) -> None:
    kw = dict(max_tokens=6, n=2, temperature=0.8, seed=11)
    r = server.client().completions.create(model="tiny", prompt=PROMPTS, extra_body=NO_EOS, **kw)
    assert sorted(c.index for c in r.choices) == list(range(6))
    by_index = {c.index: c.text for c in r.choices}
    for k, p in enumerate(PROMPTS):
        # Seeded draws depend only on (seed, position): prompt k alone gives the same two texts.
        assert [by_index[2 * k], by_index[2 * k + 1]] == _single(server, p, **kw)
    tok = server.engine.tokenizer
    assert r.usage.prompt_tokens == sum(len(tok(p)["input_ids"]) for p in PROMPTS)
    assert r.usage.completion_tokens == 3 * 2 * 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 36
    assert server.engine.get_num_unfinished_requests() == 0


def test_batch_of_token_id_lists_equals_the_batch_of_strings(server: RunningServer) -> None:
    # lm-eval's local-completions sends tokenized prompts by default (tokenized_requests=True).
    ids = [server.engine.tokenizer(p)["input_ids"] for p in PROMPTS]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 5, "temperature": 0, "stop": ["\n\n"],
            "seed": 1234, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    texts = [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
    by_text = httpx.post(server.url + "/v1/completions", json={**body, "prompt": PROMPTS}, timeout=60).json()
    assert texts == [c["text"] for c in sorted(by_text["choices"], key=lambda c: c["index"])]
    assert texts == [_single(server, p, max_tokens=5, temperature=0)[0] for p in PROMPTS]


def test_streamed_batch_deltas_rebuild_each_choice_and_usage_is_summed(server: RunningServer) -> None:
    kw = dict(max_tokens=7, n=2, temperature=1.0, seed=3)
    full = server.client().completions.create(model="tiny", prompt=PROMPTS, extra_body=NO_EOS, **kw)
    chunks = list(server.client().completions.create(model="tiny", prompt=PROMPTS, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body=NO_EOS, **kw))
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in full.choices}
    assert finishes == {i: "length" for i in range(6)}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 42
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("as_ids", [False, True])
def test_echo_prefixes_each_choice_with_its_prompt(server: RunningServer, stream: bool, as_ids: bool) -> None:
    tok = server.engine.tokenizer
    prompts = [PROMPTS[0], PROMPTS[2]]
    if as_ids:  # a token-id prompt echoes its decoded text
        prompts = [tok(p)["input_ids"] for p in prompts]
    body = {"model": "tiny", "prompt": prompts, "max_tokens": 4, "temperature": 0, "echo": True,
            "ignore_eos": True}
    plain = httpx.post(server.url + "/v1/completions", json={**body, "echo": False}, timeout=60).json()
    generated = {c["index"]: c["text"] for c in plain["choices"]}
    if stream:
        texts: dict[int, str] = {}
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    else:
        texts = {c["index"]: c["text"] for c in
                 httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"]}
    echoed = [tok.decode(p) if as_ids else p for p in prompts]
    assert texts == {0: echoed[0] + generated[0], 1: echoed[1] + generated[1]}


def test_a_bad_prompt_in_a_batch_fails_the_whole_request_and_leaves_nothing_running(
        server: RunningServer) -> None:
    too_long = list(range(5, 5 + server.engine.max_model_len + 1))
    for prompt, param in (([PROMPTS[0], too_long], "prompt"), ([], "prompt"), ([PROMPTS[0], []], "prompt")):
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    wait_for(lambda: server.engine.get_num_unfinished_requests() == 0)
    ok = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPTS, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 3


def test_lm_eval_generate_until_shape_through_the_openai_client(server: RunningServer) -> None:
    # lm-eval 0.4 local-completions with --batch_size 3: prompt list, greedy, stop list, seed;
    # it reads choices sorted by index, one per prompt.
    r = server.client().completions.create(model="tiny", prompt=PROMPTS, max_tokens=8, temperature=0,
                                           stop=["\n\n", "Question:"], seed=1234)
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert len(texts) == 3
    assert texts == [server.client().completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0,
                                                        stop=["\n\n", "Question:"], seed=1234).choices[0].text
                     for p in PROMPTS]
