"""An executor whose verify step sends back more tokens for a request than its drafts + 1 ends that
request with an ExecutorOutputError; the other requests finish as they would alone and the engine
carries on. It used to raise a bare AssertionError out of update_from_output, which stopped the
whole engine. (Several tokens for a request without drafts stay allowed: they are appended and
computed next step, as tests/core/test_decode_step_shortcuts.py has it.)
"""

from __future__ import annotations

import pytest

from twinserve.core import EngineCore, FinishReason, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import make_request, reference_output, run_streams

BS = 4
MAX_LEN = 128


def _core() -> tuple[EngineCore, FakeExecutor]:
    cfg = SchedulerConfig(block_size=BS, num_blocks=64, max_num_batched_tokens=64, max_model_len=MAX_LEN)
    ex = FakeExecutor(block_size=BS, model_kv=True, num_speculative_tokens=2)
    return EngineCore(cfg, ex, speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=2)), ex


@pytest.mark.parametrize("extra", [1, 3])
def test_a_verify_step_with_too_many_tokens_fails_that_request_alone(extra: int) -> None:
    core, ex = _core()
    sched = core.scheduler
    good = [make_request(f"g{i}", [10 + 7 * i + j for j in range(3 + 4 * i)], 8) for i in range(2)]
    bad = make_request("bad", [200 + j for j in range(5)], 8)
    for req in (good[0], bad, good[1]):
        core.add_request(req)
    run = ex.execute
    went_bad: list[int] = []

    def execute(so):
        mro = run(so)
        toks = mro.sampled_token_ids.get("bad")
        drafts = (so.scheduled_spec_decode_tokens or {}).get("bad", [])
        if toks and drafts and not went_bad:
            if len(toks) == len(drafts) + 1:
                toks += [toks[-1]] * extra  # every draft accepted, and more tokens than can be
                went_bad.append(core.num_steps)
        return mro
    ex.execute = execute

    seen, failed_at = run_streams(core, 400, "the engine with one bad request")
    assert went_bad, "the fault was never planted"
    toks, reason, error = seen["bad"]
    assert reason is FinishReason.ERROR
    assert error is not None and error.startswith("ExecutorOutputError: request 'bad'"), error
    assert f"{3 + extra} sampled tokens for a step verifying 2 draft(s) (at most 3)" in error
    assert failed_at == went_bad[0]  # in the step that went wrong, not later
    # Nothing of the bad step reached the client.
    assert toks == bad.output_token_ids and len(toks) < 8
    ref = FakeExecutor(block_size=BS)
    for req in good:
        assert seen[req.request_id] == (reference_output(ref, req, MAX_LEN), FinishReason.LENGTH, None)
    assert not sched.running and not sched.requests and sched.kv.num_free_blocks == sched.config.num_blocks
    # The engine serves on: the same prompt again runs to its end.
    again = make_request("again", list(bad.prompt_token_ids), 8)
    core.add_request(again)
    after, failed = run_streams(core, 100, "the engine after the failure", start=1000.0)
    assert failed is None and after["again"][0] == reference_output(ref, again, MAX_LEN)
