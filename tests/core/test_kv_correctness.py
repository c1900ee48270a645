"""Every position a request attends to holds its own prefix's KV: stale blocks, collisions, copies."""

from __future__ import annotations

from twinserve.core import RequestStatus, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor, KVSlotModel
from twinserve.core.kv import KVCacheManager
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams

from .helpers import Arrival, drive, make_request, reference_output


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
    # A and B compute the same prompt in the same step (neither can hit the other). A ends and
    # its blocks are evicted; B still holds a valid copy, which must serve C's lookup.
    cfg = SchedulerConfig(block_size=4, num_blocks=16, max_num_batched_tokens=64, max_model_len=64)
    prompt = list(range(1, 14))
    a = make_request("A", prompt, 1)
    b = make_request("B", prompt, 30)
    c = make_request("C", prompt, 1)
    filler = make_request("X", list(range(200, 240)), 1)  # takes every free block: evicts A's
    core, log = drive(cfg, [Arrival(0, a), Arrival(0, b), Arrival(2, filler), Arrival(4, c)])
    assert a.prefix_hit_tokens == 0 and b.prefix_hit_tokens == 0
    assert filler.prefix_hit_tokens == 0
    assert c.prefix_hit_tokens == 12  # B's copy, still running when C arrives
    assert b.status == RequestStatus.FINISHED_LENGTH


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
