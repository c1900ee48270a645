"""Targeted property tests for wrong-KV bugs, run through the KV-modelling executor.

Random workloads rarely hit the two shapes that let a request read KV that is not its
own, so each gets a strategy that makes it common: priority preemption of a request
already scheduled in the same step under a tight pool, and a hash function that
collides all the time behind equal blocks. Both fail within a few dozen examples when
blocks are cached before they are computed, or when a hit is confirmed by the parent's
hash value instead of the parent key itself.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinserve.core import RequestStatus, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor

from .helpers import Arrival, drive, make_request, reference_output


def _mod3_hash(parent, tokens, extra):
    """Three values in all: nearly every lookup meets a block of another prefix."""
    return (sum(tokens) + (parent or 0)) % 3


@st.composite
def priority_pressure(draw):
    """A long low-priority prefill, then important short requests that preempt it mid-prefill."""
    bs = draw(st.sampled_from([2, 4]))
    long_len = draw(st.integers(4 * bs, 8 * bs))
    num_blocks = draw(st.integers(long_len // bs + 1, long_len // bs + 4))
    cfg = SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(8, 20)), max_num_seqs=8,
        max_model_len=num_blocks * bs, long_prefill_token_threshold=draw(st.sampled_from([3, 5, 6, 7])),
        block_size=bs, num_blocks=num_blocks, policy=draw(st.sampled_from(["priority", "fcfs"])),
        preemption="priority")
    arrivals = [Arrival(0, make_request("long", list(range(1, long_len + 1)), draw(st.integers(1, 4)),
                                        priority=3))]
    for i in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 2 * bs))
        arrivals.append(Arrival(draw(st.integers(1, 3)), make_request(
            f"s{i}", list(range(50 + 10 * i, 50 + 10 * i + n)), draw(st.integers(1, 3 * bs)),
            priority=draw(st.integers(0, 2)))))
    if draw(st.booleans()):  # a later request shares the long prompt
        arrivals.append(Arrival(draw(st.integers(2, 12)),
                                make_request("twin", list(range(1, long_len + 1)), 2)))
    return cfg, arrivals


@st.composite
def colliding_prefixes(draw):
    """Prompts over a 3-token alphabet with a 3-valued hash: equal blocks behind other prefixes."""
    bs = draw(st.sampled_from([1, 2, 3]))
    cfg = SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(4, 16)), max_num_seqs=4, max_model_len=32,
        block_size=bs, num_blocks=draw(st.integers(32 // bs, 96 // bs)),
        prefix_caching_hash_algo=_mod3_hash, long_prefill_token_threshold=draw(st.sampled_from([0, 3])))
    arrivals = []
    for i in range(draw(st.integers(2, 8))):
        prompt = draw(st.lists(st.integers(0, 2), min_size=1, max_size=12))
        arrivals.append(Arrival(draw(st.integers(0, 6)), make_request(f"r{i}", prompt, draw(st.integers(1, 4)))))
    return cfg, arrivals


def _check_outputs(cfg, arrivals, log):
    ex = FakeExecutor(block_size=cfg.block_size)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ex, a.request, cfg.max_model_len)
        assert a.request.status == RequestStatus.FINISHED_LENGTH


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(priority_pressure())
def test_preemption_in_the_same_step_never_leaves_stale_kv(w):
    cfg, arrivals = w
    core, log = drive(cfg, arrivals)
    _check_outputs(cfg, arrivals, log)
    assert core.scheduler.kv.num_free_blocks == cfg.num_blocks


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(colliding_prefixes())
def test_hash_collisions_never_hand_out_another_prefixs_kv(w):
    cfg, arrivals = w
    core, log = drive(cfg, arrivals)
    _check_outputs(cfg, arrivals, log)
