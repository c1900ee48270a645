"""The real engine with a wrong computed-token count: that request fails with a ComputedTokensError,
the others finish with transformers' tokens, and the engine serves on (it used to spin forever)."""

from __future__ import annotations

import pytest

from twinserve.backends.real import SamplingParams

from .conftest import hf_greedy, prompts_ids
from ..limits import bounded

SP = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _finish(engine) -> dict:
    finished = {}
    for _ in bounded(200, "the engine with one bad request"):
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0]
        if not engine.has_unfinished_requests():
            return finished
    raise AssertionError("unreachable")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["worker_sampled_nothing", "prefix_hit_past_end"])
def test_a_wrong_computed_token_count_fails_only_that_request(make_llm, tiny_dir, fault) -> None:
    llm = make_llm(engine_core_mode="inproc")
    engine = llm.llm_engine
    sched = engine.core.scheduler
    good_prompt, bad_prompt = prompts_ids(2, seed=31)
    if fault == "worker_sampled_nothing":
        run = engine.executor.execute

        def execute(so):  # the worker counts the prompt as unfinished: no token for it
            mro = run(so)
            if "bad" in mro.sampled_token_ids and not sched.requests["bad"].output_token_ids:
                del mro.sampled_token_ids["bad"]
            return mro
        engine.executor.execute = execute
    else:
        lookup = sched.kv.get_computed_blocks

        def get_computed_blocks(req):  # a hit that counts the last prompt token too
            blocks, n = lookup(req)
            return (blocks, req.num_tokens) if req.request_id == "bad" else (blocks, n)
        sched.kv.get_computed_blocks = get_computed_blocks
    engine.add_request("good", {"prompt_token_ids": good_prompt}, SP)
    engine.add_request("bad", {"prompt_token_ids": bad_prompt}, SP)
    finished = _finish(engine)
    bad = finished["bad"]
    assert bad.finish_reason == "error" and not bad.token_ids
    assert bad.error.startswith("ComputedTokensError: request 'bad'") and "num_computed_tokens" in bad.error
    assert finished["good"].token_ids == hf_greedy(tiny_dir, good_prompt, 6)
    assert engine.dead is None
    assert sched.kv.num_free_blocks == engine.scheduler_config.num_blocks
    # The engine serves on.
    again = llm.generate([{"prompt_token_ids": good_prompt}], SP, use_tqdm=False)[0].outputs[0]
    assert again.token_ids == finished["good"].token_ids
