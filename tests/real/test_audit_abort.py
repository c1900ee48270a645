"""Aborting a request with n > 1 ends every one of its sequences (docs/test-audit.md)."""

from __future__ import annotations

from twinserve.backends.real import SamplingParams

from .conftest import prompts_ids


def test_abort_of_an_n_request_ends_all_its_sequences_and_frees_their_kv(make_llm) -> None:
    engine = make_llm().llm_engine
    kv = engine.core.scheduler.kv
    sp = SamplingParams(n=3, temperature=1.0, seed=4, max_tokens=100, ignore_eos=True)
    engine.add_request("fan", {"prompt_token_ids": prompts_ids(1, seed=26)[0]}, sp)
    for _ in range(3):
        engine.step()
    outs = engine.abort_request("fan")
    assert len(outs) == 1 and outs[0].finished
    assert [c.finish_reason for c in outs[0].outputs] == ["abort"] * 3
    engine.step()  # the core drops aborted requests' state on the next step
    assert not engine.has_unfinished_requests()
    assert kv.num_free_blocks == kv.num_blocks
