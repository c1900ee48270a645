"""logprobs/top_logprobs (chat) and echo + logprobs (completions) through the official openai client,
equal to transformers' log-softmax for the same tokens; streamed and not."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from .conftest import RunningServer

TOL = 1e-4


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float64).eval()


def _ref(hf: Any, ids: list[int]) -> torch.Tensor:
    """log-softmax of transformers' logits: row i is the distribution of token i + 1."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0], dim=-1)


def _top(ref_row: torch.Tensor, n: int) -> list[int]:
    return ref_row.topk(n).indices.tolist()


def test_completions_echo_logprobs_max_tokens_0_as_lm_eval_asks(server: RunningServer, hf: Any) -> None:
    tok = server.engine.tokenizer
    text = "the quick brown fox jumps over the lazy dog"
    ids = tok(text)["input_ids"]
    out = server.client().completions.create(model="tiny", prompt=text, echo=True, logprobs=1, max_tokens=0)
    ch = out.choices[0]
    assert ch.text == text and out.usage.completion_tokens == 0
    lp = ch.logprobs
    ref = _ref(hf, ids)
    assert lp.tokens == [tok.decode([i]) for i in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert math.isclose(lp.token_logprobs[i], float(ref[i - 1, ids[i]]), abs_tol=TOL)
        best = _top(ref[i - 1], 1)[0]
        top = lp.top_logprobs[i]
        assert math.isclose(top[tok.decode([best])], float(ref[i - 1, best]), abs_tol=TOL)
        assert tok.decode([ids[i]]) in top  # the chosen token is listed too, as OpenAI documents
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_echo_token_ids_with_generation(server: RunningServer, hf: Any, stream: bool) -> None:
    tok = server.engine.tokenizer
    ids = tok("paged attention stores keys")["input_ids"]
    kw = dict(model="tiny", prompt=ids, echo=True, logprobs=3, max_tokens=4, temperature=0,
              extra_body={"ignore_eos": True})
    if stream:
        text, tokens, token_lps, tops = "", [], [], []
        for chunk in server.client().completions.create(stream=True, **kw):
            c = chunk.choices[0]
            text += c.text
            if c.logprobs is not None:
                tokens += c.logprobs.tokens
                token_lps += c.logprobs.token_logprobs
                tops += c.logprobs.top_logprobs
    else:
        c = server.client().completions.create(**kw).choices[0]
        text, tokens, token_lps, tops = c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs
    assert len(tokens) == len(ids) + 4
    gen_ids = [tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(i)) for i in ids]  # ids round-trip
    assert gen_ids == ids
    assert text.startswith(tok.decode(ids))
    # Rebuild the generated ids from greedy decoding under transformers and compare every value.
    full = list(ids)
    for _ in range(4):
        full.append(int(_ref(hf, full)[-1].argmax()))
    ref = _ref(hf, full)
    assert tokens == [tok.decode([i]) for i in full]
    assert token_lps[0] is None
    for i in range(1, len(full)):
        assert math.isclose(token_lps[i], float(ref[i - 1, full[i]]), abs_tol=TOL)
        want = {tok.decode([t]) for t in _top(ref[i - 1], 3)} | {tok.decode([full[i]])}
        assert set(tops[i]) == want
        names = [tok.decode([t]) for t in _top(ref[i - 1], 3)]
        for t, name in zip(_top(ref[i - 1], 3), names):
            if names.count(name) == 1:  # byte pieces of one character can share the text "\ufffd"
                assert math.isclose(tops[i][name], float(ref[i - 1, t]), abs_tol=TOL)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_and_top_logprobs(server: RunningServer, hf: Any, stream: bool) -> None:
    tok = server.engine.tokenizer
    messages = [{"role": "user", "content": "the lazy dog"}]
    prompt = server.engine.chat_prompt(messages)["prompt_token_ids"]
    kw = dict(model="tiny", messages=messages, logprobs=True, top_logprobs=2, max_tokens=5, temperature=0,
              extra_body={"ignore_eos": True})
    if stream:
        content: list[Any] = []
        text = ""
        for chunk in server.client().chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            text += c.delta.content or ""
            if c.logprobs is not None and c.logprobs.content:
                content += c.logprobs.content
    else:
        c = server.client().chat.completions.create(**kw).choices[0]
        content, text = c.logprobs.content, c.message.content
    assert len(content) == 5
    full = list(prompt)
    for _ in range(5):
        full.append(int(_ref(hf, full)[-1].argmax()))
    ref = _ref(hf, full)
    gen = full[len(prompt):]
    assert "".join(e.token for e in content) == tok.decode(gen) == text
    for k, e in enumerate(content):
        row = ref[len(prompt) + k - 1]
        assert e.token == tok.decode([gen[k]]) and e.bytes == list(e.token.encode())
        assert math.isclose(e.logprob, float(row[gen[k]]), abs_tol=TOL)
        assert [t.token for t in e.top_logprobs] == [tok.decode([t]) for t in _top(row, 2)]
        for t, want in zip(e.top_logprobs, _top(row, 2)):
            assert math.isclose(t.logprob, float(row[want]), abs_tol=TOL)


def test_chat_without_logprobs_has_none(server: RunningServer) -> None:
    c = server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2).choices[0]
    assert c.logprobs is None


def test_echo_stream_with_max_tokens_0(server: RunningServer) -> None:
    text = "numbers 0 1 2 3"
    chunks = list(server.client().completions.create(model="tiny", prompt=text, echo=True, max_tokens=0,
                                                     stream=True, logprobs=0))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_max_tokens_0_without_echo_is_400(server: RunningServer) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="tiny", prompt="x", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"


def test_lm_eval_loglikelihood_batch_of_token_ids(server: RunningServer, hf: Any) -> None:
    """lm-eval's local-completions loglikelihood request: a batch of tokenized context+continuation
    prompts, echo, logprobs=1, max_tokens=1, greedy. It sums token_logprobs[ctxlen:-1] and calls the
    continuation greedy when each of its tokens is the top-1 entry; both must match transformers."""
    tok = server.engine.tokenizer
    pairs = [("the quick brown fox", " jumps over"), ("hello there", " general"), ("a b c", " d e f")]
    prompts, ctxlens = [], []
    for ctx, cont in pairs:
        c_ids, w_ids = tok(ctx)["input_ids"], tok(ctx + cont)["input_ids"]
        prompts.append(w_ids)
        ctxlens.append(len(c_ids))
    # And a continuation that is the model's own greedy one, so is_greedy is true at least once.
    ids = tok("one two three")["input_ids"]
    ctxlens.append(len(ids))
    for _ in range(2):
        ids = ids + [int(_ref(hf, ids)[-1].argmax())]
    prompts.append(ids)
    greedy_seen = []
    out = server.client().completions.create(model="tiny", prompt=prompts, echo=True, logprobs=1,
                                             max_tokens=1, temperature=0, seed=1234)
    choices = sorted(out.choices, key=lambda c: c.index)
    assert len(choices) == len(prompts)
    for ch, ids, ctxlen in zip(choices, prompts, ctxlens):
        lp = ch.logprobs
        assert len(lp.token_logprobs) == len(ids) + 1  # the echoed prompt, then the one sampled token
        got = sum(lp.token_logprobs[ctxlen:-1])
        ref = _ref(hf, ids)
        want = sum(float(ref[i - 1, ids[i]]) for i in range(ctxlen, len(ids)))
        assert math.isclose(got, want, abs_tol=TOL * len(ids))
        greedy = all(max(lp.top_logprobs[i], key=lp.top_logprobs[i].get) == lp.tokens[i]
                     for i in range(ctxlen, len(ids)))
        want_greedy = all(int(ref[i - 1].argmax()) == ids[i] for i in range(ctxlen, len(ids)))
        assert greedy == want_greedy
        greedy_seen.append(greedy)
    assert greedy_seen[-1] and not all(greedy_seen)
