"""The real engine with an executor whose verify step sends back a token too many for one request:
that request ends with an ExecutorOutputError its caller sees, the other finishes with transformers'
tokens, and the engine serves on (the bad count raised a bare AssertionError that stopped the engine)."""

from __future__ import annotations

import pytest

from twinserve.backends.real import SamplingParams

from .conftest import hf_greedy, prompts_ids
from ..limits import bounded

SP = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.mark.timeout(300)
def test_a_token_too_many_fails_only_that_request(make_llm, tiny_dir) -> None:
    llm = make_llm(engine_core_mode="inproc", speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    engine = llm.llm_engine
    sched = engine.core.scheduler
    good_prompt, bad_prompt = prompts_ids(2, seed=37)
    run = engine.executor.execute
    planted = []

    def execute(so):
        mro = run(so)
        toks = mro.sampled_token_ids.get("bad")
        drafts = (so.scheduled_spec_decode_tokens or {}).get("bad")
        if toks and not planted:
            if drafts:  # the verify step: one token more than its drafts can yield
                mro.sampled_token_ids["bad"] = list(drafts) + [toks[-1], toks[-1]]
                planted.append(len(sched.requests["bad"].output_token_ids))
            else:  # a random tiny model rarely repeats itself: hand the scheduler drafts to verify
                mro.spec_token_ids["bad"] = [toks[-1], toks[-1]]
        return mro
    engine.executor.execute = execute
    engine.add_request("good", {"prompt_token_ids": good_prompt}, SP)
    engine.add_request("bad", {"prompt_token_ids": bad_prompt}, SP)
    finished = {}
    for _ in bounded(200, "the engine with one bad request"):
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0]
        if not engine.has_unfinished_requests():
            break
    assert planted
    bad = finished["bad"]
    assert bad.finish_reason == "error" and len(bad.token_ids) == planted[0]  # none of the bad step's
    assert bad.error.startswith("ExecutorOutputError: request 'bad'") and "4 sampled tokens" in bad.error
    assert finished["good"].token_ids == hf_greedy(tiny_dir, good_prompt, 6)
    assert engine.dead is None
    assert sched.kv.num_free_blocks == engine.scheduler_config.num_blocks
    again = llm.generate([{"prompt_token_ids": bad_prompt}], SP, use_tqdm=False)[0].outputs[0]
    assert again.token_ids == hf_greedy(tiny_dir, bad_prompt, 6)
