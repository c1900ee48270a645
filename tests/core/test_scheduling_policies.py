"""Queue order, aging, preemption requeueing, admission watermark and min_tokens."""

from __future__ import annotations

import pytest

from twinserve.core import (EngineCore, FinishReason, InvalidConfigError, RequestStatus,
                            SchedulerConfig)
from twinserve.core.fake_executor import FakeExecutor

from .helpers import make_request
from ..limits import bounded


def _stream(cfg: SchedulerConfig, victim_kw: dict, short_kw: dict, steps: int):
    """A request at t=0, then a steady stream of short ones (one per step) that keeps the
    server busy; returns the first request and every short one."""
    core = EngineCore(cfg, FakeExecutor(block_size=cfg.block_size, model_kv=True))
    # Two short ones already wait, so one is always there when a slot frees.
    victim = make_request("victim", list(range(1, 41)), 2, arrival_time=0.0, **victim_kw)
    shorts = [make_request(f"s{i}", [i % 50 + 100, 7], 2, arrival_time=0.0, **short_kw) for i in range(2)]
    for r in (*shorts, victim):
        core.add_request(r)
    for step in range(steps):
        t = float(step)
        s = make_request(f"s{step + 2}", [step % 50 + 100, 7], 2, arrival_time=t, **short_kw)
        core.add_request(s)
        shorts.append(s)
        core.step(t)
    return core, victim, shorts


@pytest.mark.parametrize("policy,victim_kw,short_kw", [
    ("sjf", {}, {}),                            # a long prompt among short ones
    ("priority", {"priority": 1}, {"priority": 0}),  # an unimportant one among important ones
])
def test_aging_serves_every_request_under_a_steady_stream(policy, victim_kw, short_kw):
    # Two slots, each short request holds one for 2 steps, one arrives per step: the queue
    # never empties. With aging the first request outranks newcomers once it has waited
    # aging_interval_s, and nobody waits much longer than that.
    base = dict(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                num_blocks=64, policy=policy)
    core, victim, shorts = _stream(SchedulerConfig(**base, aging_interval_s=10.0), victim_kw, short_kw, 400)
    assert victim.status == RequestStatus.FINISHED_LENGTH
    assert victim.first_scheduled_time <= 10.0 + 4
    served = [r for r in shorts if r.first_scheduled_time is not None]
    assert len(served) >= len(shorts) - 6  # only the last few arrivals still wait
    assert max(r.first_scheduled_time - r.arrival_time for r in served) <= 10.0 + 4
    # Without aging the same stream holds the first request back for good.
    core, victim, _ = _stream(SchedulerConfig(**base, aging_interval_s=0.0), victim_kw, short_kw, 400)
    assert victim.first_scheduled_time is None


def test_aging_keeps_strict_order_among_requests_that_arrived_together():
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                          num_blocks=64, policy="priority", aging_interval_s=10.0)
    core = EngineCore(cfg, FakeExecutor(block_size=4))
    reqs = [make_request(f"p{p}", [1, 2, p], 1, priority=p, arrival_time=0.0) for p in (2, 0, 1)]
    for r in reqs:
        core.add_request(r)
    order = []
    t = 0.0
    for _ in bounded():
        if not core.has_unfinished_requests():
            break
        so = core.scheduler.schedule(t)
        order += [n.req_id for n in so.scheduled_new_reqs]
        core.scheduler.update_from_output(so, core.executor.execute(so), t)
        t += 1.0
    assert order == ["p0", "p1", "p2"]


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "10", True])
def test_bad_aging_interval(value):
    with pytest.raises(InvalidConfigError, match="aging_interval_s"):
        SchedulerConfig(aging_interval_s=value)


@pytest.mark.parametrize("policy", ["fcfs", "sjf", "priority"])
def test_preempted_request_goes_back_to_the_front(policy):
    # A holds most of the pool and grows; short requests queue behind it. When A is preempted
    # it must be readmitted before the short ones that arrived after it (as vLLM requeues
    # preempted requests), not ranked behind them by prompt length.
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                          num_blocks=12, policy=policy, preemption="last", aging_interval_s=0.0)
    core = EngineCore(cfg, FakeExecutor(block_size=4, model_kv=True))
    a = make_request("A", list(range(1, 25)), 20)
    b = make_request("B", list(range(30, 42)), 20)
    core.add_request(a)
    core.add_request(b)
    t = 0.0
    while not (b.num_preemptions or a.num_preemptions):
        core.step(t)
        t += 1.0
        assert t < 100
    victim = b if b.num_preemptions else a
    later = [make_request(f"s{i}", [200 + i], 3, arrival_time=t) for i in range(3)]
    for r in later:
        core.add_request(r)
    assert next(iter(core.scheduler.waiting)) is victim
    admitted = []
    while core.has_unfinished_requests():
        so = core.scheduler.schedule(t)
        admitted += [n.req_id for n in so.scheduled_new_reqs]
        core.scheduler.update_from_output(so, core.executor.execute(so), t)
        t += 1.0
        assert t < 1000
    assert admitted[0] == victim.request_id


def test_watermark_never_blocks_a_request_when_nothing_runs():
    # The watermark keeps headroom for running requests to grow; with nothing running, a
    # request that needs more than the pool minus the watermark must still be admitted.
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                          num_blocks=10, watermark=0.5)
    core = EngineCore(cfg, FakeExecutor(block_size=4))
    big = make_request("big", list(range(1, 33)), 2)  # 8 of 10 blocks; 5 must stay free
    small = make_request("small", [1, 2, 3], 2)
    core.add_request(big)
    so = core.scheduler.schedule(0.0)
    assert [n.req_id for n in so.scheduled_new_reqs] == ["big"]
    core.scheduler.update_from_output(so, core.executor.execute(so), 0.0)
    # With big running, the watermark holds: 2 free blocks, none may be taken below 5 free.
    core.add_request(small)
    so = core.scheduler.schedule(1.0)
    assert so.scheduled_new_reqs == []
    core.scheduler.update_from_output(so, core.executor.execute(so), 1.0)
    t = 2.0
    for _ in bounded():
        if not core.has_unfinished_requests():
            break
        core.step(t)
        t += 1.0
        assert t < 100
    assert big.status == small.status == RequestStatus.FINISHED_LENGTH


def test_watermark_is_not_applied_in_the_step_that_empties_the_running_set():
    # big finishes in the same update that would leave the pool empty; the next step must
    # admit the waiting request without the watermark.
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                          num_blocks=10, watermark=0.5)
    core = EngineCore(cfg, FakeExecutor(block_size=4))
    core.add_request(make_request("a", [1, 2, 3], 1))
    core.add_request(make_request("b", list(range(1, 33)), 1))
    core.step(0.0)
    so = core.scheduler.schedule(1.0)
    assert [n.req_id for n in so.scheduled_new_reqs] == ["b"]


@pytest.mark.parametrize("min_tokens", [0, 1, 2, 3])
def test_min_tokens_come_before_any_stop(min_tokens):
    # vLLM's meaning: min_tokens tokens are generated before EOS or a stop token can end the
    # request, so the earliest stop is token number min_tokens + 1.
    ex = FakeExecutor(block_size=4)
    prompt = [5, 6, 7]
    toks = list(prompt)
    for _ in range(6):
        toks.append(ex.next_token(toks[-1], len(toks)))
    outs = toks[len(prompt):]
    assert len(set(outs)) == len(outs)
    cfg = SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=64)
    for stop_at in range(4):
        core = EngineCore(cfg, FakeExecutor(block_size=4))
        eos = make_request("eos", prompt, 6, eos_token_id=outs[stop_at], min_tokens=min_tokens)
        stop = make_request("stop", prompt, 6, stop_token_ids=[outs[stop_at]], min_tokens=min_tokens)
        core.add_request(eos)
        core.add_request(stop)
        t = 0.0
        for _ in bounded():
            if not core.has_unfinished_requests():
                break
            core.step(t)
            t += 1.0
        for r in (eos, stop):
            if stop_at >= min_tokens:
                assert r.output_token_ids == outs[:stop_at + 1] and r.finish_reason == FinishReason.STOP
            else:  # the stop token came too early to count, and never comes again
                assert r.output_token_ids == outs and r.finish_reason == FinishReason.LENGTH


def _decode_all(sched, so, t: float) -> None:
    """Every scheduled request that reached the end of its input samples token 9."""
    from twinserve.core import ModelRunnerOutput

    sampled = {rid: [9] for rid in so.num_scheduled_tokens
               if sched.requests[rid].num_computed_tokens == sched.requests[rid].num_tokens}
    sched.update_from_output(so, ModelRunnerOutput(sampled), t)


def test_priority_victim_is_strict_priority_however_long_the_other_has_run():
    # A priority-5 request runs from t=0; a priority-0 one arrives at t=200. With aging on
    # (the default 30 s), the victim is still the priority-5 one: running is not waiting,
    # so running long must not make a request the important one (as vLLM's strict priority).
    from twinserve.core import Scheduler

    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=32, block_size=4,
                                      num_blocks=4, policy="priority", aging_interval_s=30.0))
    low = make_request("low", [1] * 8, 8, priority=5, arrival_time=0.0)
    sched.add_request(low)
    _decode_all(sched, sched.schedule(0.0), 0.5)
    high = make_request("high", [2] * 4, 8, priority=0, arrival_time=200.0)
    sched.add_request(high)
    so = sched.schedule(200.0)  # low takes its third block, high the last one
    assert set(so.num_scheduled_tokens) == {"low", "high"}
    _decode_all(sched, so, 200.5)
    so = sched.schedule(201.0)  # high needs a second block: someone gives theirs back
    assert so.preempted_req_ids == ["low"]
    assert so.num_scheduled_tokens == {"high": 1}


def test_aging_counts_time_spent_waiting_not_running():
    # A (priority 1) runs from t=0 and is preempted at t=101; B (priority 0) has waited
    # since t=50. A's 101 s of running must not age it past B: B ranks first.
    from twinserve.core import Scheduler

    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=32, block_size=4,
                                      num_blocks=5, max_num_seqs=2, policy="priority",
                                      aging_interval_s=30.0))
    a = make_request("A", [1] * 4, 12, priority=1, arrival_time=0.0)
    c = make_request("C", [3] * 4, 12, priority=0, arrival_time=0.0)
    for r in (a, c):
        sched.add_request(r)
    _decode_all(sched, sched.schedule(0.0), 0.5)
    b = make_request("B", [2] * 4, 12, priority=0, arrival_time=50.0)
    sched.add_request(b)
    for t in (50.0, 51.0, 52.0, 100.0):  # no seat for B; both grow to two blocks each
        _decode_all(sched, sched.schedule(t), t + 0.5)
    so = sched.schedule(101.0)  # both need a third block, one is free
    assert so.preempted_req_ids == ["A"]
    assert [r.request_id for r in sched.waiting] == ["B", "A"]
    assert a.waited_s == 0.0 and a.queued_time == 101.0
    so = sched.schedule(102.0)
    assert [n.req_id for n in so.scheduled_new_reqs] == ["B"]
    assert b.waited_s == 102.0 - 50.0


def test_aging_keeps_the_time_waited_before_a_preemption():
    # A (priority 2) waits 60 s behind X and Y, runs from t=60 and is preempted at T < 70 for
    # its third block; B (priority 0) arrived at t=60.5. Ranks (aging 10 s): A 2 + (T - 60) / 10
    # < 3, since its first 60 s of waiting still count; B 6.05. So A goes back ahead of B. An aging
    # origin that forgot the first wait (queued_time alone) ranks A 2 + T / 10 > 8, behind B.
    from twinserve.core import Scheduler

    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=32, block_size=4,
                                      num_blocks=5, max_num_seqs=2, policy="priority",
                                      aging_interval_s=10.0))
    for r in (make_request("X", [3] * 4, 1, priority=0, arrival_time=0.0),
              make_request("Y", [1] * 4, 12, priority=0, arrival_time=0.0),
              make_request("A", [2] * 4, 12, priority=2, arrival_time=0.0)):
        sched.add_request(r)
    so = sched.schedule(0.0)
    assert [n.req_id for n in so.scheduled_new_reqs] == ["X", "Y"]
    _decode_all(sched, so, 0.5)  # X ends: a seat for A
    so = sched.schedule(60.0)
    assert [n.req_id for n in so.scheduled_new_reqs] == ["A"]
    _decode_all(sched, so, 60.5)
    sched.add_request(make_request("B", [4] * 4, 4, priority=0, arrival_time=60.5))
    for t in range(61, 100):
        so = sched.schedule(float(t))
        if so.preempted_req_ids:
            break
        _decode_all(sched, so, t + 0.5)
    assert so.preempted_req_ids == ["A"] and sched.requests["A"].waited_s == 60.0
    assert [r.request_id for r in sched.waiting] == ["A", "B"]
