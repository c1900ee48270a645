"""Aborting a queued request leaves the others' admission order intact (docs/test-audit.md)."""

from __future__ import annotations

import random

import pytest

from twinserve.core import EngineCore, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor

from .helpers import make_request
from ..limits import bounded


@pytest.mark.parametrize("policy", ["priority", "sjf"])
def test_aborting_queued_requests_keeps_the_rest_in_policy_order(policy: str) -> None:
    # One seat: requests are admitted one at a time, in the queue's order. Aborts of queued requests
    # (a client that hung up) take entries out of the middle of the queue's heap.
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                          num_blocks=64, policy=policy, aging_interval_s=0.0)
    core = EngineCore(cfg, FakeExecutor(block_size=4, model_kv=True))
    rng = random.Random(7)
    ranks = list(range(24))
    rng.shuffle(ranks)
    reqs = [make_request(f"r{k}", [1 + (j % 50) for j in range(k + 1)] if policy == "sjf" else [5, 6], 1,
                         priority=k if policy == "priority" else 0) for k in ranks]
    for r in reqs:
        core.add_request(r)
    aborted = {f"r{k}" for k in rng.sample(range(24), 9)}
    core.abort(sorted(aborted), now=0.0)
    admitted: list[str] = []
    t = 0.0
    for _ in bounded():
        if not core.has_unfinished_requests():
            break
        so = core.scheduler.schedule(t)
        admitted += [n.req_id for n in so.scheduled_new_reqs]
        core.scheduler.update_from_output(so, core.executor.execute(so), t)
        t += 1.0
    expected = [f"r{k}" for k in range(24) if f"r{k}" not in aborted]
    assert admitted == expected
