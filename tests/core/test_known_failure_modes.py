"""Failure modes other engines have shipped, pinned down as tests."""

from __future__ import annotations

import pytest

from twinserve.core import (EngineCore, FinishReason, InvalidRequestError, PrefixCacheBusyError,
                            PromptTooLongError, Request, RequestStatus, SamplingParams,
                            SchedulerConfig)
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.kv import KVCacheManager

from .helpers import make_request, reference_output
from ..limits import bounded


def _core(**kw) -> EngineCore:
    cfg = SchedulerConfig(**{"max_num_batched_tokens": 64, "max_model_len": 128, "block_size": 4,
                             "num_blocks": 64, **kw})
    return EngineCore(cfg, FakeExecutor(block_size=cfg.block_size, step_time=0.25))


def _run(core: EngineCore, t: float = 0.0, max_steps: int = 10_000) -> float:
    """Step until every request ends; a scheduler that stops making progress fails, not hangs."""
    for _ in range(max_steps):
        if not core.has_unfinished_requests():
            return t
        core.step(t)
        t += 1.0
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


def test_full_prefix_hit_still_computes_one_token():
    core = _core()
    prompt = list(range(1, 17))  # exactly 4 full blocks
    core.add_request(make_request("a", prompt, 2))
    _run(core)
    b = make_request("b", prompt, 2)
    core.add_request(b)
    so = core.scheduler.schedule(10.0)
    new = so.scheduled_new_reqs[0]
    # 3 blocks hit, the last block is recomputed so its last token yields logits
    assert new.num_computed_tokens == 12
    assert so.num_scheduled_tokens["b"] == 4
    assert b.prefix_hit_tokens == 12
    assert core.scheduler.kv.stats.hits == 12 and core.scheduler.kv.stats.queries == 32


def test_prompt_one_token_longer_than_blocks_hits_everything_but_the_last():
    core = _core()
    prompt = list(range(1, 18))
    core.add_request(make_request("a", prompt, 1))
    _run(core)
    core.add_request(make_request("b", prompt, 1))
    so = core.scheduler.schedule(5.0)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 16
    assert so.num_scheduled_tokens["b"] == 1


def test_preempted_request_resumes_with_prefix_hits_and_same_output():
    # 12 blocks of 4: two requests of 20-token prompts growing to 40 tokens cannot coexist
    core = _core(num_blocks=12, max_num_batched_tokens=128)
    a = make_request("a", list(range(1, 21)), 24)
    b = make_request("b", list(range(50, 70)), 24)
    core.add_request(a)
    core.add_request(b)
    t = 0.0
    resumed_hits = None
    for _ in bounded():
        if not core.has_unfinished_requests():
            break
        so = core.scheduler.schedule(t)
        for new in so.scheduled_new_reqs:
            if new.req_id == "b" and b.num_preemptions:
                resumed_hits = new.num_computed_tokens
                # a resumed request carries its generated tokens to recompute
                assert len(new.token_ids) > b.num_prompt_tokens
        mro = core.executor.execute(so)
        core.scheduler.update_from_output(so, mro, t)
        t += 1
    assert b.num_preemptions >= 1
    assert resumed_hits is not None and resumed_hits > 0
    ex = FakeExecutor(block_size=4)
    assert a.output_token_ids == reference_output(ex, a, 128)
    assert b.output_token_ids == reference_output(ex, b, 128)
    assert core.scheduler.kv.num_free_blocks == 12


@pytest.mark.parametrize("where", ["waiting", "running", "preempted"])
def test_abort_in_every_state_frees_blocks(where):
    core = _core(num_blocks=12, max_num_batched_tokens=128)
    a = make_request("a", list(range(1, 21)), 24)
    b = make_request("b", list(range(50, 70)), 24)
    core.add_request(a)
    if where == "waiting":
        core.add_request(b)
        assert b.status == RequestStatus.WAITING
    elif where == "running":
        core.add_request(b)
        core.step(0.0)
        assert b.status == RequestStatus.RUNNING
    else:
        core.add_request(b)
        t = 0.0
        while b.status != RequestStatus.PREEMPTED:
            core.step(t)
            t += 1
            assert t < 100
    outs = core.abort(["b"], now=50.0)
    assert [o.finish_reason for o in outs] == [FinishReason.ABORT]
    assert b.status == RequestStatus.FINISHED_ABORTED and b.finish_time == 50.0
    assert "b" not in core.scheduler.kv.req_to_blocks
    assert core.abort(["b"]) == []  # aborting twice is harmless
    _run(core, 60.0)
    assert a.status == RequestStatus.FINISHED_LENGTH
    assert core.scheduler.kv.num_free_blocks == 12
    assert all(r is not b for r in core.scheduler.waiting)


def test_rejects_what_can_never_be_served():
    core = _core(num_blocks=8)  # 32 tokens of KV
    with pytest.raises(InvalidRequestError, match="empty"):
        core.add_request(make_request("e", [], 4))
    with pytest.raises(PromptTooLongError, match="max_model_len"):
        core.add_request(make_request("long", list(range(129)), 4))
    with pytest.raises(PromptTooLongError, match="pool holds 32"):
        core.add_request(make_request("big", list(range(30)), 10))
    core.add_request(make_request("ok", list(range(30)), 3))
    with pytest.raises(InvalidRequestError, match="already in use"):
        core.add_request(make_request("ok", [1], 1))
    _run(core)  # the good request still completes
    assert core.scheduler.kv.num_free_blocks == 8


def test_prompt_of_exactly_max_model_len_generates_one_token():
    core = _core(max_model_len=16, num_blocks=8)
    r = make_request("r", list(range(16)), 10)
    core.add_request(r)
    _run(core)
    assert len(r.output_token_ids) == 1 and r.finish_reason == FinishReason.LENGTH


def test_reset_prefix_cache_refused_while_in_use():
    core = _core()
    core.add_request(make_request("a", list(range(1, 30)), 5))
    core.step(0.0)
    with pytest.raises(PrefixCacheBusyError):
        core.scheduler.reset_prefix_cache()
    _run(core, 1.0)
    assert core.scheduler.kv.pool.cached
    core.scheduler.reset_prefix_cache()
    assert not core.scheduler.kv.pool.cached


def test_hash_collision_never_returns_wrong_blocks():
    kv = KVCacheManager(16, 4, hash_function=lambda parent, toks, extra: 42)
    a = Request("a", [1, 2, 3, 4, 5], SamplingParams())
    kv.allocate_slots(a, 5)
    kv.cache_blocks(a, 5)
    kv.free(a)
    b = Request("b", [9, 9, 9, 9, 5], SamplingParams())
    hits, n = kv.get_computed_blocks(b)
    assert hits == [] and n == 0
    c = Request("c", [1, 2, 3, 4, 6], SamplingParams())
    hits, n = kv.get_computed_blocks(c)
    assert n == 4


def test_cache_salt_isolates_tenants():
    kv = KVCacheManager(16, 4)
    a = Request("a", list(range(9)), SamplingParams(), cache_salt="x")
    kv.allocate_slots(a, 9)
    kv.cache_blocks(a, 9)
    assert kv.get_computed_blocks(Request("b", list(range(9)), SamplingParams()))[1] == 0
    assert kv.get_computed_blocks(Request("c", list(range(9)), SamplingParams(), cache_salt="x"))[1] == 8


def test_freed_tail_blocks_are_evicted_before_heads():
    kv = KVCacheManager(6, 2)
    a = Request("a", list(range(9)), SamplingParams())  # 5 blocks, 4 full and cached
    kv.allocate_slots(a, 9)
    kv.cache_blocks(a, 9)
    order = [b.block_id for b in kv.req_to_blocks["a"]]
    kv.free(a)
    # the one never-used block comes first, then a's blocks from its tail to its head
    queue = [b.block_id for b in kv.pool.free_queue]
    assert queue[1:] == list(reversed(order))
    # taking 4 blocks (the unused one, a's partial tail, then its last two full blocks)
    # evicts a's tail and keeps its first two blocks cached
    kv.pool.get_new_blocks(4)
    hits, n = kv.get_computed_blocks(Request("b", list(range(9)), SamplingParams()))
    assert n == 4


def test_timestamps_and_step_stats():
    core = _core()
    r = make_request("r", list(range(1, 10)), 3)
    r.arrival_time = 0.0
    core.add_request(r)
    stats = []
    t = 1.0
    for _ in bounded():
        if not core.has_unfinished_requests():
            break
        _, s = core.step(t)
        stats.append(s)
        t += 1.0
    assert r.first_scheduled_time == 1.0
    assert r.first_token_time == 1.25  # step start + the executor's step time
    assert r.token_times == [1.25, 2.25, 3.25]
    assert r.finish_time == 3.25
    assert [s.num_scheduled_tokens for s in stats] == [9, 1, 1]
    assert stats[0].num_new_reqs == 1 and stats[-1].num_finished == 1
    assert stats[0].kv_usage > 0 and stats[-1].kv_usage == 0


def test_stop_token_and_eos_respect_min_tokens():
    ex = FakeExecutor(block_size=4)
    prompt = [5, 6, 7]
    toks = list(prompt)
    outs = []
    for _ in range(6):
        t = ex.next_token(toks[-1], len(toks))
        toks.append(t)
        outs.append(t)
    core = _core()
    r1 = make_request("eos", prompt, 6, eos_token_id=outs[0], min_tokens=0)
    r2 = make_request("stop", list(prompt), 6, stop_token_ids=[outs[2]], min_tokens=2)
    r3 = make_request("ign", list(prompt), 6, eos_token_id=outs[0], ignore_eos=True)
    for r in (r1, r2, r3):
        core.add_request(r)
    _run(core)
    assert r1.output_token_ids == outs[:1] and r1.finish_reason == FinishReason.STOP
    assert r2.output_token_ids == outs[:3] and r2.stop_reason == outs[2]
    assert r3.output_token_ids == outs and r3.finish_reason == FinishReason.LENGTH
