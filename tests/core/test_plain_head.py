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


def test_plain_update_hands_each_request_its_logprobs_cut_at_a_stop() -> None:
    """The plain update sets logprobs after its loop: each output gets its own request's, and a run of
    several tokens stopped inside keeps one logprob per token kept (a single token's list is never cut)."""
    from twinserve.core import FinishReason, Request, SamplingParams
    from twinserve.core.sched.output import Logprob

    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=32))
    for rid in ("a", "b", "c"):
        sched.add_request(Request(rid, [1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=[99])))
    so = sched.schedule(0.0)
    sched.update_from_output(so, ModelRunnerOutput({"a": [5], "b": [6], "c": [7]}), 0.0)
    so = sched.schedule(1.0)
    lp = {rid: [Logprob(t, -0.5 * t, 1) for t in toks]
          for rid, toks in {"a": [8], "b": [9, 99, 4], "c": [3]}.items()}
    lp["c"] = lp["c"] * 2  # longer than its one token: a single token's list is passed as it came
    outs = sched.update_from_output(so, ModelRunnerOutput({"a": [8], "b": [9, 99, 4], "c": [3]}, logprobs=lp), 1.0)
    by_id = {o.req_id: o for o in outs}
    assert by_id["a"].new_logprobs == lp["a"] and by_id["c"].new_logprobs == lp["c"]
    assert by_id["b"].new_token_ids == [9, 99] and by_id["b"].finish_reason == FinishReason.STOP
    assert by_id["b"].new_logprobs == lp["b"][:2]
    so = sched.schedule(2.0)
    outs = sched.update_from_output(so, ModelRunnerOutput({"a": [2], "c": [2]}), 2.0)
    assert [o.new_logprobs for o in outs] == [None, None]
