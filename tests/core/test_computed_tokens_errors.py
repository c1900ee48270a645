"""A wrong num_computed_tokens ends that request with a ComputedTokensError, never a hang.

A request left with no token to compute was skipped by every step and kept the engine busy
forever (the old scheduler). The count can go wrong at each place it is set: a prefix-cache hit,
a host-tier load, the executor (it sampled nothing for a finished prompt), or a caller.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core import EngineCore, FinishReason, InvalidRequestError, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.sched.scheduler import Scheduler
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import make_request, reference_output
from ..limits import bounded

BS = 4
MAX_LEN = 128
KINDS = ("executor_sampled_nothing", "prefix_hit_past_end", "count_set_while_running", "count_set_while_queued")


def _drive(core: EngineCore, before_step=None) -> dict[str, tuple[list[int], FinishReason | None, str | None]]:
    """Step until every request ends (bounded: the old hang fails here); tokens, finish reason, error.

    Also records under "@step" (tokens [n]) the step whose outputs ended a request with an error.
    """
    seen: dict[str, tuple[list[int], FinishReason | None, str | None]] = {}
    for step in bounded(400, "the engine with one bad request"):
        if not core.has_unfinished_requests():
            return seen
        if before_step is not None:
            before_step(step)
        outs, _ = core.step(float(step))
        for o in outs:
            toks, _, _ = seen.get(o.req_id, ([], None, None))
            seen[o.req_id] = (toks + list(o.new_token_ids), o.finish_reason, o.error)
            if o.error is not None:
                seen["@step"] = ([step], None, None)
    raise AssertionError("unreachable")


def _assert_only_bad_failed(core: EngineCore, seen, good, bad_id: str) -> None:
    toks, reason, error = seen[bad_id]
    assert reason is FinishReason.ERROR
    assert error.startswith("ComputedTokensError: ") and repr(bad_id) in error and "num_computed_tokens" in error
    ref = FakeExecutor(block_size=BS)
    for req in good:
        assert seen[req.request_id][0] == reference_output(ref, req, MAX_LEN), req.request_id
        assert seen[req.request_id][1] is FinishReason.LENGTH
    sched = core.scheduler
    assert not sched.running and not sched.requests and sched.kv.num_free_blocks == sched.config.num_blocks


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(KINDS), past=st.integers(0, 3), policy=st.sampled_from(["mixed", "prefill_first"]),
       budget=st.sampled_from([5, 64]), spec=st.booleans(), num_good=st.integers(1, 3),
       prompt_len=st.integers(2, 13))
def test_a_wrong_computed_token_count_fails_that_request_alone(kind, past, policy, budget, spec, num_good,
                                                               prompt_len) -> None:
    cfg = SchedulerConfig(block_size=BS, num_blocks=64, max_num_batched_tokens=budget, max_model_len=MAX_LEN,
                          batch_policy=policy)
    k = 2 if spec else 0
    ex = FakeExecutor(block_size=BS, model_kv=True, num_speculative_tokens=k)
    core = EngineCore(cfg, ex, speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=k)
                      if spec else None)
    good = [make_request(f"g{i}", [10 + 7 * i + j for j in range(3 + 4 * i)], 6) for i in range(num_good)]
    bad = make_request("bad", [200 + j for j in range(prompt_len)], 6)
    for req in good[:1] + [bad] + good[1:]:
        core.add_request(req)
    sched = core.scheduler
    went_bad = [0]  # the step from which no step could advance it

    if kind == "executor_sampled_nothing":
        run = ex.execute

        def execute(so):  # the worker thinks the prompt is not done: no token for it
            mro = run(so)
            if not bad.output_token_ids and "bad" in mro.sampled_token_ids:
                del mro.sampled_token_ids["bad"]
                went_bad[0] = core.num_steps + 1
            return mro
        ex.execute = execute
    elif kind == "prefix_hit_past_end":
        lookup = sched.kv.get_computed_blocks

        def get_computed_blocks(req):  # a hit counting the token we must sample from, or more
            blocks, n = lookup(req)
            return (blocks, req.num_tokens + past) if req is bad else (blocks, n)
        sched.kv.get_computed_blocks = get_computed_blocks
    elif kind == "count_set_while_queued":
        bad.num_computed_tokens = 1 + past

    def before_step(step: int) -> None:
        if (kind == "count_set_while_running" and bad.status.name == "RUNNING" and bad.output_token_ids
                and not went_bad[0]):
            bad.num_computed_tokens = bad.num_tokens + past
            went_bad[0] = step

    seen = _drive(core, before_step)
    _assert_only_bad_failed(core, seen, good, "bad")
    # Failed by the first step that finds it, however busy the others keep the batch.
    assert seen["@step"][0] == [went_bad[0]]


def test_a_stalled_request_behind_a_long_chunk_fails_in_that_step() -> None:
    # The first loop stops after g0's chunk (the budget may not cover the rest): the checked loop meets it.
    cfg = SchedulerConfig(block_size=BS, num_blocks=64, max_num_batched_tokens=8, max_model_len=MAX_LEN,
                          long_prefill_token_threshold=4)
    core = EngineCore(cfg, FakeExecutor(block_size=BS, model_kv=True))
    bad = make_request("bad", [200, 201, 202], 6)
    good = [make_request(f"d{i}", [50 + i, 60 + i], 6) for i in range(4)] + [make_request("g0", list(range(300, 340)), 6)]
    for req in [bad] + good[:4]:
        core.add_request(req)
    sched = core.scheduler

    def before_step(step: int) -> None:
        if step == 1:
            core.add_request(good[4])
        if step == 2:  # g0 chunking, first in line; then bad, with nothing to compute
            sched.running.remove(good[4])
            sched.running.insert(0, good[4])
            bad.num_computed_tokens = bad.num_tokens
    seen = _drive(core, before_step)
    assert seen["@step"][0] == [2]
    _assert_only_bad_failed(core, seen, good, "bad")


def _sessions() -> list:
    """3 sessions x 3 turns of growing 28-token contexts over a 16-block pool: later turns load from the host."""
    out = []
    for s in range(3):
        context = [100 + 37 * s + i for i in range(28)]
        for t in range(3):
            out.append((t * 40 + s * 3, make_request(f"s{s}t{t}", list(context), 3)))
            context += [7 + s, 8 + t, 9]
    return out


@pytest.mark.parametrize("past", [0, 2])
def test_a_host_tier_load_counting_past_the_prompt_fails_that_request_alone(monkeypatch, past) -> None:
    victims: list[str] = []
    finish = Scheduler._finish_loads

    def finish_loads(self, job_ids):  # the first load reports every token (or more) as computed
        before = list(self.loaded)
        finish(self, job_ids)
        for req in self.loaded:
            if req not in before and not victims:
                victims.append(req.request_id)
                req.num_computed_tokens = req.num_tokens + past
    monkeypatch.setattr(Scheduler, "_finish_loads", finish_loads)
    cfg = SchedulerConfig(block_size=BS, num_blocks=16, max_num_batched_tokens=16, max_model_len=MAX_LEN,
                          kv_offloading_blocks=64)
    core = EngineCore(cfg, FakeExecutor(block_size=BS, model_kv=True, load_delay=1))
    arrivals = _sessions()
    pending = sorted(arrivals, key=lambda a: a[0])

    def before_step(step: int) -> None:
        while pending and pending[0][0] <= step:
            core.add_request(pending.pop(0)[1])
    seen = {}
    for step in bounded(2000, "sessions with one bad load"):
        before_step(step)
        if not pending and not core.has_unfinished_requests():
            break
        outs, _ = core.step(float(step))
        for o in outs:
            toks, _, _ = seen.get(o.req_id, ([], None, None))
            seen[o.req_id] = (toks + list(o.new_token_ids), o.finish_reason, o.error)
    assert victims
    _assert_only_bad_failed(core, seen, [r for _, r in arrivals if r.request_id != victims[0]], victims[0])
    assert "host-tier (KV) load" in seen[victims[0]][2]


def test_a_request_arriving_with_a_computed_count_is_refused_by_name() -> None:
    core = EngineCore(SchedulerConfig(block_size=BS, num_blocks=64, max_model_len=MAX_LEN), FakeExecutor(block_size=BS))
    req = make_request("x", [1, 2, 3], 2)
    req.num_computed_tokens = 2
    with pytest.raises(InvalidRequestError, match="num_computed_tokens=2") as info:
        core.add_request(req)
    assert info.value.param == "num_computed_tokens"
    assert not core.has_unfinished_requests()


@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
@pytest.mark.parametrize("spec", [False, True])
@pytest.mark.parametrize("when", ["decoding", "mid_prefill"])
@pytest.mark.parametrize("value", [-1, -9])
def test_a_negative_computed_token_count_fails_that_request_alone(policy, spec, when, value) -> None:
    # Below 0 the step would compute positions before the prompt: the model runner indexes its block
    # table and token ids with them (numpy takes -1 as the last entry: other blocks' KV, silently).
    # Only the test executor's contract check stopped it, and that stops every request; the stalled
    # path (a count past the end) already fails the one request by name.
    cfg = SchedulerConfig(block_size=BS, num_blocks=64, max_num_batched_tokens=5, max_model_len=MAX_LEN,
                          batch_policy=policy)
    k = 2 if spec else 0
    core = EngineCore(cfg, FakeExecutor(block_size=BS, model_kv=True, num_speculative_tokens=k),
                      speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=k) if spec else None)
    good = [make_request("g0", [10, 11, 12], 6), make_request("g1", [20 + j for j in range(9)], 6)]
    bad = make_request("bad", [200 + j for j in range(13)], 6)
    for req in [good[0], bad, good[1]]:
        core.add_request(req)
    went_bad = [0]

    def before_step(step: int) -> None:
        started = bad.output_token_ids if when == "decoding" else 0 < bad.num_computed_tokens < bad.num_tokens
        if bad.status.name == "RUNNING" and started and not went_bad[0]:
            bad.num_computed_tokens = value
            went_bad[0] = step

    seen = _drive(core, before_step)
    assert went_bad[0]
    _assert_only_bad_failed(core, seen, good, "bad")
    assert f"num_computed_tokens={value}" in seen["bad"][2] and "negative" in seen["bad"][2]
    assert seen["@step"][0] == [went_bad[0]]
