"""An executor that sends back a token for a request whose prompt is still being prefilled (a chunked
prefill that has not reached the prompt's end samples nothing: ModelRunnerOutput, and the runner's
sampling rows) ends that request with an ExecutorOutputError; the token never reaches the client, the
other requests finish as they would alone and the engine carries on. The token used to be appended to
the output (and to the prompt still being computed) without a word."""

from __future__ import annotations

import pytest

from twinserve.core import EngineCore, FinishReason, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import make_request, reference_output, run_streams

BS = 4
MAX_LEN = 128


@pytest.mark.parametrize("spec, policy", [(False, "mixed"), (True, "mixed"), (False, "prefill_first")],
                         ids=["plain", "speculating", "prefill-first"])
@pytest.mark.parametrize("chunk", [1, 2], ids=["first-chunk", "second-chunk"])
def test_a_token_sampled_for_a_partial_prefill_fails_that_request_alone(spec: bool, policy: str, chunk: int) -> None:
    # 8 tokens a step: the 21-token prompt takes several chunked steps; the fault is planted in the
    # first (admission) or the second (a running request's next chunk).
    cfg = SchedulerConfig(block_size=BS, num_blocks=64, max_num_batched_tokens=8, max_model_len=MAX_LEN,
                          long_prefill_token_threshold=0, batch_policy=policy)
    ex = FakeExecutor(block_size=BS, model_kv=True, num_speculative_tokens=2 if spec else 0)
    core = EngineCore(cfg, ex, speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=2)
                      if spec else None)
    sched = core.scheduler
    good = make_request("good", [10 + j for j in range(3)], 6)
    bad = make_request("bad", [200 + j for j in range(21)], 6)
    core.add_request(good)
    core.add_request(bad)
    run = ex.execute
    planted: list[int] = []
    partial_steps: list[int] = []

    def execute(so):
        mro = run(so)
        req = sched.requests.get("bad")
        partial = req is not None and "bad" in so.num_scheduled_tokens and req.num_computed_tokens < req.num_tokens
        if partial:
            partial_steps.append(core.num_steps)
        if partial and len(partial_steps) == chunk and not planted:
            assert "bad" not in mro.sampled_token_ids  # the executor's own contract
            mro.sampled_token_ids["bad"] = [7]
            planted.append(core.num_steps)
        return mro
    ex.execute = execute

    seen, failed_at = run_streams(core, 200, "the engine with one bad request")
    assert planted, "the fault was never planted"
    toks, reason, error = seen["bad"]
    assert reason is FinishReason.ERROR, seen["bad"]
    assert error is not None and error.startswith("ExecutorOutputError: request 'bad'"), error
    assert "prompt" in error
    assert failed_at == planted[0]  # in the step that went wrong
    assert toks == [] and 7 not in bad.output_token_ids and bad.prompt_token_ids == [200 + j for j in range(21)]
    assert seen["good"] == (reference_output(FakeExecutor(block_size=BS), good, MAX_LEN), FinishReason.LENGTH, None)
    assert not sched.running and not sched.requests and sched.kv.num_free_blocks == cfg.num_blocks
    again = make_request("again", [200 + j for j in range(21)], 6)
    core.add_request(again)
    after, failed = run_streams(core, 100, "the engine after the failure", start=1000.0)
    assert failed is None and after["again"][0] == reference_output(FakeExecutor(block_size=BS), again, MAX_LEN)
