"""Output kinds: delta outputs carry only new tokens until the last one; final_only emits once."""

from __future__ import annotations

import pytest

from twinserve.backends.real import SamplingParams
from twinserve.core.errors import InvalidRequestError

from .conftest import add_with_bad_stop_id, prompts_ids
from ..limits import bounded

PARAMS = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=7, logprobs=2, n=2)


def _drain(engine, kind: str, prompt: list[int]) -> list:
    engine.add_request("r", {"prompt_token_ids": prompt}, PARAMS, output_kind=kind)
    outs = []
    for _ in bounded():
        if not engine.has_unfinished_requests():
            break
        outs.extend(engine.step())
    return outs


@pytest.mark.parametrize("kind", ["delta", "final_only"])
def test_lean_kinds_give_the_same_final_output_as_cumulative(make_llm, kind: str) -> None:
    engine = make_llm().llm_engine
    prompt = prompts_ids(1, seed=9)[0]
    ref = _drain(engine, "cumulative", prompt)
    got = _drain(engine, kind, prompt)
    for a, b in zip(ref[-1].outputs, got[-1].outputs):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert [lp.token_id for lp in a.logprobs] == [lp.token_id for lp in b.logprobs] == a.token_ids
    # Cumulative outputs repeat everything; each output's list is a prefix of the next.
    assert len(ref) > 2 and all(len(c.token_ids) <= len(d.token_ids)
                                for x, y in zip(ref, ref[1:]) for c, d in zip(x.outputs, y.outputs))
    if kind == "final_only":
        assert len(got) == 1 and got[0].finished
        return
    assert len(got) == len(ref)
    for o in got[:-1]:  # nothing copied but the new tokens
        assert all(c.token_ids == [] and c.logprobs == [] for c in o.outputs)
    for i in range(2):
        deltas = [t for o in got for t in o.outputs[i].token_ids_delta]
        assert deltas == got[-1].outputs[i].token_ids
        assert "".join(o.outputs[i].text_delta for o in got) == got[-1].outputs[i].text


def test_unknown_output_kind_is_a_typed_error(make_llm) -> None:
    engine = make_llm().llm_engine
    with pytest.raises(InvalidRequestError, match="output_kind"):
        engine.add_request("x", {"prompt_token_ids": [5, 6]}, SamplingParams(), output_kind="partial")
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("kind", ["delta", "final_only"])
def test_lean_kinds_carry_prompt_logprobs_and_a_sampling_error(make_llm, kind: str) -> None:
    engine = make_llm().llm_engine
    prompt, bad_prompt = prompts_ids(2, seed=31)
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, prompt_logprobs=2)
    engine.add_request("ref", {"prompt_token_ids": prompt}, sp)  # cumulative
    ref = []
    for _ in bounded():
        if not engine.has_unfinished_requests():
            break
        ref.extend(o for o in engine.step() if o.finished)
    engine.add_request("ok", {"prompt_token_ids": prompt}, sp, output_kind=kind)
    add_with_bad_stop_id(engine, "bad", bad_prompt,
                         SamplingParams(temperature=0.7, seed=1, max_tokens=5, min_tokens=3), output_kind=kind)
    outs: dict[str, list] = {"ok": [], "bad": []}
    for _ in bounded():
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            outs[o.request_id].append(o)
    bad = outs["bad"][-1].outputs[0]
    assert outs["bad"][-1].finished and bad.finish_reason == "error" and "sampling failed" in bad.error
    ok = outs["ok"]
    plp = ok[-1].prompt_logprobs
    assert ok[-1].finished and len(plp) == len(prompt) and all(r is not None for r in plp[1:])
    if kind == "final_only":
        assert len(ok) == 1 and len(outs["bad"]) == 1
        return
    # Streaming echo needs the prompt logprobs before the request ends: the first output has them.
    assert ok[0].prompt_logprobs is not None and all(r is not None for r in ok[0].prompt_logprobs[1:])
    assert [(r.token_id, r.logprob) for r in plp[1:]] == [(r.token_id, r.logprob)
                                                          for r in ref[0].prompt_logprobs[1:]]
