"""SGLang's receive poll (`recv_interval`, --scheduler-recv-interval): new requests are read every N
decode steps, at once after a prefill step or on an idle engine (core/sched/scheduler.py _received)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinserve.core import Request, SamplingParams, Scheduler, SchedulerConfig
from twinserve.core.errors import InvalidConfigError

from .helpers import assert_like_reference_and_freed, drive
from .test_batch_policy import _step
from .test_scheduler_properties import _fields, workloads


def _sched(interval: int) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128,
                                     block_size=4, num_blocks=128, batch_policy="prefill_first",
                                     recv_interval=interval))


def _first_step_of(sched: Scheduler, rid: str, start: int, limit: int = 40) -> int:
    for t in range(start, start + limit):
        if rid in _step(sched, float(t)):
            return t
    raise AssertionError(f"{rid} never scheduled")


def test_a_request_arriving_during_decodes_waits_for_the_next_poll() -> None:
    sched = _sched(4)
    sched.add_request(Request("r0", [1, 2, 3, 4], SamplingParams(max_tokens=60)))
    assert _step(sched, 0.0) == {"r0": 4}  # idle engine: read at once; a prefill step
    assert _step(sched, 1.0) == {"r0": 1}  # after a prefill the poll reads at once (counter reset)
    # The poll before each step adds the last step's weight: step 2 (after decode step 1) makes it 1.
    _step(sched, 2.0)
    sched.add_request(Request("r1", [7, 8, 9], SamplingParams(max_tokens=5)))
    assert "r1" not in sched.running and len(sched.waiting) == 1
    # Steps 3 and 4 make it 2 and 3 (r1 unread); step 5 makes it 4: read, and r1 prefills then.
    assert _first_step_of(sched, "r1", 3) == 5


def test_interval_one_reads_at_once_and_an_idle_engine_reads_at_once() -> None:
    for interval in (1, 30):
        sched = _sched(interval)
        sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=3)))
        assert _step(sched, 0.0) == {"a": 3}  # idle: read at once whatever the interval
    sched = _sched(1)
    sched.add_request(Request("r0", [1, 2, 3, 4], SamplingParams(max_tokens=60)))
    for t in range(4):
        _step(sched, float(t))
    sched.add_request(Request("r1", [7, 8, 9], SamplingParams(max_tokens=5)))
    assert _first_step_of(sched, "r1", 4) == 4  # no poll: the next step admits it


def test_recv_interval_must_be_positive() -> None:
    with pytest.raises(InvalidConfigError):
        SchedulerConfig(recv_interval=0)



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([2, 5, 30]), st.sampled_from(["mixed", "prefill_first"]))
def test_a_receive_poll_delays_admissions_only_and_outputs_stay_exact(w, interval, policy) -> None:
    """Random workloads under a receive poll: every request finishes with its exact output, no step
    passes the budget, and every block comes back (the poll's timing is pinned by the tests above)."""
    cfg, arrivals = w
    cfg = SchedulerConfig(**{**_fields(cfg), "batch_policy": policy, "recv_interval": interval})

    def check(core, so, waiting_before):
        assert so.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        # An unread request is never in a step.
        assert not {r.request_id for r in core.scheduler.unreceived} & set(so.num_scheduled_tokens)

    core, log = drive(cfg, arrivals, check=check)
    assert_like_reference_and_freed(core, log, cfg, arrivals)
