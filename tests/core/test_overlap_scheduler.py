"""TensorRT-LLM's overlap scheduler (`overlap_scheduler`): the executor loop fetches new requests before it
handles the step in flight, so a request that reaches a busy engine during step n joins step n + 2, not
n + 1; an engine with nothing running reads at once (core/sched/scheduler.py _fetched_late)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from twinserve.core import Request, SamplingParams, Scheduler, SchedulerConfig
from twinserve.core.errors import InvalidConfigError

from .helpers import assert_like_reference_and_freed, drive
from .test_batch_policy import _step
from .test_scheduler_properties import _fields, workloads


def _sched(overlap: bool) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128,
                                     block_size=4, num_blocks=128, overlap_scheduler=overlap))


def _first_step_of(sched: Scheduler, rid: str, start: int, limit: int = 40) -> int:
    for t in range(start, start + limit):
        if rid in _step(sched, float(t)):
            return t
    raise AssertionError(f"{rid} never scheduled")


@pytest.mark.parametrize("overlap, joins", [(False, 3), (True, 4)])
def test_a_request_arriving_during_a_step_joins_one_step_later_with_the_overlap(overlap, joins) -> None:
    sched = _sched(overlap)
    sched.add_request(Request("r0", [1, 2, 3, 4], SamplingParams(max_tokens=60)))
    assert _step(sched, 0.0) == {"r0": 4}  # idle engine: read at once, overlap or not
    _step(sched, 1.0)
    _step(sched, 2.0)
    # r1 reaches the engine while step 2 runs: the loop reads it at step 3's start without the overlap, and
    # with it only at step 4's (iteration 3 fetched as soon as step 2 was launched).
    sched.add_request(Request("r1", [7, 8, 9], SamplingParams(max_tokens=5)))
    assert _first_step_of(sched, "r1", 3) == joins


def test_an_engine_with_nothing_running_reads_at_once() -> None:
    sched = _sched(True)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=1)))
    assert _step(sched, 0.0) == {"a": 3}  # its only token: a finishes in step 0
    assert not sched.running
    sched.add_request(Request("b", [4, 5, 6], SamplingParams(max_tokens=3)))
    assert _step(sched, 1.0) == {"b": 3}  # nothing runs: the fetch blocks and takes b at once


def test_a_held_request_stays_first_in_line_for_the_step_after() -> None:
    sched = _sched(True)
    sched.add_request(Request("r0", [1, 2, 3, 4], SamplingParams(max_tokens=60)))
    _step(sched, 0.0)
    sched.add_request(Request("r1", [7, 8, 9], SamplingParams(max_tokens=5)))
    assert _step(sched, 1.0) == {"r0": 1}  # r1 arrived during step 0: held
    sched.add_request(Request("r2", [10, 11], SamplingParams(max_tokens=5)))
    # Step 2 reads r1 (it arrived before step 1 began), not r2 (it arrived while step 1 ran).
    assert _step(sched, 2.0) == {"r0": 1, "r1": 3}
    assert _step(sched, 3.0) == {"r0": 1, "r1": 1, "r2": 2}


def test_the_overlap_is_the_mixed_policys() -> None:
    with pytest.raises(InvalidConfigError):
        SchedulerConfig(overlap_scheduler=True, batch_policy="prefill_first")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_the_overlap_delays_admissions_only_and_outputs_stay_exact(w) -> None:
    """Random workloads under the overlap: every request finishes with its exact output, no step passes the
    budget, every block comes back, and a request held from a step is never in it."""
    cfg, arrivals = w
    cfg = SchedulerConfig(**{**_fields(cfg), "batch_policy": "mixed", "recv_interval": 1,
                             "overlap_scheduler": True})
    by_step: dict[int, set[str]] = {}
    for a in arrivals:
        by_step.setdefault(a.step, set()).add(a.request.request_id)
    step = [0]

    def check(core, so, waiting_before):
        assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        sched = core.scheduler
        new = {r.req_id for r in so.scheduled_new_reqs}
        ran_before = ({r.request_id for r in sched.running} - new) | set(so.preempted_req_ids)
        if ran_before:  # a busy engine: what reached it for this step is read at the next one
            assert not by_step.get(step[0], set()) & new
        step[0] += 1

    core, log = drive(cfg, arrivals, check=check)
    assert_like_reference_and_freed(core, log, cfg, arrivals)
