"""The plain first loop (core/sched/fast_loop.plain_head) decides as the general loop does.

Without speculation, Scheduler.schedule takes plain_head instead of its general loop (issue 53
item 13). Speculation that is on but never gets drafts runs the general loop with nothing to
verify, so every step's outputs must be the same both ways, preemptions and block ids included.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings

from twinserve.core import ModelRunnerOutput, Scheduler, SchedulerConfig, TwinserveError
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import Arrival
from .test_scheduler_properties import workloads


def _token(req) -> int:
    """A deterministic toy next token (stops and EOS land now and then)."""
    ids = req.all_token_ids
    return (ids[-1] * 31 + len(ids) * 7) % 1000


def _run(cfg: SchedulerConfig, arrivals: list[Arrival], spec: SpeculativeConfig | None) -> list:
    """Every step's schedule and outputs, as plain data."""
    sched = Scheduler(cfg, spec)
    arrivals = copy.deepcopy(arrivals)
    last = max(a.step for a in arrivals)
    log: list = []
    for step in range(3000):
        for a in arrivals:
            if a.step == step:
                try:
                    sched.add_request(a.request)
                except TwinserveError as e:
                    log.append(("refused", a.request.request_id, type(e).__name__))
        if step > last and not sched.has_unfinished_requests():
            break
        so = sched.schedule(float(step))
        c = so.scheduled_cached_reqs
        log.append((dict(so.num_scheduled_tokens), list(c.req_ids), [list(b) for b in c.new_block_ids],
                    list(c.num_computed_tokens), list(so.preempted_req_ids), so.total_num_scheduled_tokens,
                    [(n.req_id, list(n.block_ids), n.num_computed_tokens) for n in so.scheduled_new_reqs],
                    dict(so.scheduled_spec_decode_tokens)))
        sampled = {}
        for rid in so.num_scheduled_tokens:
            req = sched.requests[rid]
            if req.num_computed_tokens == len(req.all_token_ids):
                sampled[rid] = [_token(req)]
        outs = sched.update_from_output(so, ModelRunnerOutput(sampled), float(step))
        log.append([(o.req_id, list(o.new_token_ids), o.finish_reason) for o in outs])
    return log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_plain_head_schedules_as_the_general_loop(workload) -> None:
    """Fails on a planted off-by-one in plain_head's fast-decode bound (c <= limit skips a block)."""
    cfg, arrivals = workload
    idle_spec = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    assert idle_spec.active(1) and idle_spec.num_lookahead_tokens == 0
    assert _run(cfg, arrivals, None) == _run(cfg, arrivals, idle_spec)
