"""Every position a request attends to holds its own prefix's KV: stale blocks, collisions, copies."""

from __future__ import annotations

from twinserve.core import EngineCore, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor, KVSlotModel
from twinserve.core.kv import KVCacheManager
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams

from .helpers import Arrival, drive, make_request, reference_output
from ..limits import bounded


def test_priority_preemption_in_the_step_never_caches_uncomputed_blocks():
    # The case: A is scheduled for positions 12-17, then preempted in the same step by
    # higher-priority B and F. Its blocks for 12-17 were never computed; A's re-admission must
    # not find them as prefix hits (before the fix it read position 12 from an empty block).
    cfg = SchedulerConfig(block_size=4, num_blocks=8, max_num_batched_tokens=16,
                          long_prefill_token_threshold=6, policy="priority", max_model_len=64)
    a = make_request("A", list(range(100, 124)), 1, priority=2)
    arrivals = [Arrival(0, a), Arrival(1, make_request("B", [1, 2, 3, 4], 20, priority=0)),
                Arrival(1, make_request("F", [5, 6, 7, 8], 2, priority=0))]
    core, log = drive(cfg, arrivals)  # the KV-modelling executor raises on a wrong read
    assert a.num_preemptions == 1
    assert log.admitted.count("A") == 2
    ex = FakeExecutor(block_size=4)
    for arr in arrivals:
        assert log.outputs[arr.request.request_id] == reference_output(ex, arr.request, 64)
    assert core.executor.num_kv_reads > 0


def _colliding_hash(parent, tokens, extra):
    """Equal values for any two blocks with the same multiset of tokens and parent value."""
    return hash((parent, tuple(sorted(tokens)), extra))


def _compute(kv: KVCacheManager, slots: KVSlotModel, req: Request) -> None:
    """Admit and compute a whole request as one step would (hits, allocate, write, check, cache)."""
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_hit, hits, num_hit) is not None
    blocks = [b.block_id for b in kv.req_to_blocks[req.request_id]]
    pids = slots.prefix_ids(req.all_token_ids, [])
    slots.write(blocks, pids, num_hit, req.num_tokens)
    slots.check(req.request_id, blocks, pids, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    kv.cache_blocks(req, req.num_tokens)


def test_colliding_first_blocks_never_give_a_child_hit_across_prefixes():
    # [4,3,2,1] and [1,2,3,4] hash alike, and so do their children [5,6,7,8]: only the parent's
    # identity tells the chains apart. Whatever order the prefixes are computed in, a lookup
    # returns only blocks holding the looked-up request's own prefix.
    for order in (("b", "a"), ("a", "b")):
        kv = KVCacheManager(32, 4, hash_function=_colliding_hash)
        slots = KVSlotModel(4)
        prompts = {"a": [1, 2, 3, 4, 5, 6, 7, 8, 9], "b": [4, 3, 2, 1, 0]}
        for rid in order:
            req = Request(rid, prompts[rid], SamplingParams())
            _compute(kv, slots, req)
            kv.free(req)
        c = Request("c", [4, 3, 2, 1, 5, 6, 7, 8, 0], SamplingParams())
        hits, n = kv.get_computed_blocks(c)
        assert n <= 4, f"{order}: block [5,6,7,8] under another first block was hit"
        pids = slots.prefix_ids(c.all_token_ids, [])
        slots.check("c", [b.block_id for b in hits], pids, n)
        _compute(kv, slots, c)  # and computing the rest reads only c's own prefix


def test_recomputed_copy_takes_the_key_so_it_serves_hits_after_the_first_copy_is_evicted():
    # B looked the prompt up before A had allocated it, so both compute their own copy. The
    # latest copy (B's, still held) takes the key; A's copy is freed first and evicted, and
    # C must still hit B's copy rather than lose the prefix with A's.
    kv = KVCacheManager(8, 4)
    slots = KVSlotModel(4)
    prompt = list(range(1, 14))
    a, b = Request("A", prompt, SamplingParams()), Request("B", prompt, SamplingParams())
    assert kv.get_computed_blocks(b)[1] == 0
    _compute(kv, slots, a)
    assert kv.allocate_slots(b, 13) is not None
    pids = slots.prefix_ids(b.all_token_ids, [])
    b_blocks = [blk.block_id for blk in kv.req_to_blocks["B"]]
    slots.write(b_blocks, pids, 0, 13)
    b.num_computed_tokens = 13
    kv.free(a)
    pressure = kv.pool.get_new_blocks(kv.num_free_blocks)  # evicts everything free, A's copy too
    kv.pool.free_blocks(pressure)
    c = Request("C", prompt, SamplingParams())
    hits, n = kv.get_computed_blocks(c)
    assert n == 12 and [blk.block_id for blk in hits] == b_blocks[:3]
    slots.check("C", [blk.block_id for blk in hits], slots.prefix_ids(c.all_token_ids, []), n)


def test_abort_with_the_step_in_flight_drops_its_uncomputed_blocks():
    # The engine scheduled A's prefill, then the step failed (the executor never ran it) and A
    # was aborted: A's blocks were registered at allocation but hold nothing. B, with the same
    # prompt, must compute them again instead of reading them.
    cfg = SchedulerConfig(block_size=4, num_blocks=16, max_num_batched_tokens=64, max_model_len=64)
    core = EngineCore(cfg, FakeExecutor(block_size=4, model_kv=True))
    prompt = list(range(1, 14))
    core.add_request(make_request("A", prompt, 2))
    so = core.scheduler.schedule(0.0)
    assert so.num_scheduled_tokens == {"A": 13}
    core.abort(["A"], now=0.0)  # no update_from_output: the step never came back
    b = make_request("B", prompt, 2)
    core.add_request(b)
    t = 1.0
    for _ in bounded():
        if not core.has_unfinished_requests():
            break
        core.step(t)  # the KV-modelling executor raises on a read of an unwritten slot
        t += 1.0
    assert b.prefix_hit_tokens == 0
    assert b.output_token_ids == reference_output(FakeExecutor(block_size=4), b, 64)


def test_chained_keys_compare_copy_and_pickle_without_recursion():
    # A key names its whole prefix through parent objects; a 20,000-block chain (block size 1
    # at a long context) must not hit the recursion limit in ==, hash, repr, copy or pickle.
    import copy
    import pickle

    from twinserve.core.kv import BlockHash

    key = None
    for i in range(20_000):
        key = BlockHash(i, key, (i % 7,), None)
    other = None
    for i in range(20_000):
        other = BlockHash(i, other, (i % 7,) if i else (1,), None)  # differs only at the root
    assert key != other and not key == other
    for clone in (pickle.loads(pickle.dumps(key)), copy.deepcopy(key)):
        assert clone is not key and clone == key and hash(clone) == hash(key)
    assert "parent_value=19998" in repr(key)
