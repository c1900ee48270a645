"""A sliding-window KV manager frees the blocks a request's window has left behind, and nothing else.

Every position a step attends to (its window) must still hold the request's own KV, modelled slot
by slot (KVSlotModel); blocks in use, read from the pool's counters, must equal the formula.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core.fake_executor import KVSlotModel
from twinserve.core.kv import KVCacheManager
from twinserve.core.kv.kv_cache_manager import OUT_OF_WINDOW
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams

BS = 4


def held_by_formula(total: int, computed: int, window: int) -> int:
    """Blocks of one request after allocating up to `total` tokens with `computed` done."""
    return -(-total // BS) - max(0, computed - window + 1) // BS


def _step(kv: KVCacheManager, slots: KVSlotModel, req: Request, pids: list[int], n: int, window: int) -> None:
    c = req.num_computed_tokens
    assert kv.allocate_slots(req, n) is not None
    ids = [b.block_id for b in kv.req_to_blocks[req.request_id]]
    slots.write(ids, pids, c, c + n)
    # Every new token's window still holds this request's KV.
    lo = max(0, c - window + 1)
    slots.check(req.request_id, ids, pids, c + n, lo)
    req.num_computed_tokens = c + n
    kv.cache_blocks(req, c + n)


def test_blocks_in_use_follow_the_formula_at_8x_the_window() -> None:
    window = 8
    kv = KVCacheManager(64, BS, enable_caching=True, sliding_window=window)
    slots = KVSlotModel(BS)
    req = Request("r", list(range(8 * window)), SamplingParams(max_tokens=1))
    pids = slots.prefix_ids(req.all_token_ids, [])
    for n in [5, 7, 1, 1, 13, 2] + [1] * 35:
        c = req.num_computed_tokens
        _step(kv, slots, req, pids, n, window)
        assert kv.num_held_blocks("r") == held_by_formula(c + n, c, window)
        assert kv.num_blocks - kv.num_free_blocks == kv.num_held_blocks("r")
    assert req.num_computed_tokens == 8 * window
    # Full attention would hold 16 blocks here; the window keeps 3.
    assert kv.num_held_blocks("r") <= -(-window // BS) + 1 < 8 * window // BS
    assert kv.num_window_freed == 16 - kv.num_held_blocks("r")
    kv.free(req)
    assert kv.num_free_blocks == 64


@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 13), chunks=st.lists(st.integers(1, 9), min_size=1, max_size=20),
       stem=st.integers(0, 2), preempt_at=st.integers(0, 25))
def test_windows_never_read_freed_or_foreign_blocks(window: int, chunks: list[int], stem: int,
                                                    preempt_at: int) -> None:
    """Two requests sharing a prefix, one preempted and resumed with prefix hits, under pool pressure."""
    kv = KVCacheManager(20, BS, enable_caching=True, sliding_window=window)
    slots = KVSlotModel(BS)
    prompt = [stem] * 9 + list(range(30))
    reqs = [Request(f"r{i}", prompt + [i] * 5, SamplingParams(max_tokens=1)) for i in range(2)]
    pids = {r.request_id: slots.prefix_ids(r.all_token_ids, []) for r in reqs}
    done = 0
    for i, n in enumerate(chunks * 2):
        for req in reqs:
            rid = req.request_id
            left = req.num_tokens - req.num_computed_tokens
            if left == 0:
                continue
            if rid not in kv.req_to_blocks:
                hits, num_hit = kv.get_computed_blocks(req)
                if kv.allocate_slots(req, min(n, req.num_tokens - num_hit), hits, num_hit) is None:
                    continue
                ids = [b.block_id for b in kv.req_to_blocks[rid]]
                # A hit is a prefix whose window part holds exactly this request's KV.
                slots.check(rid, ids, pids[rid], num_hit, max(0, num_hit - window + 1))
                c, m = num_hit, min(n, req.num_tokens - num_hit)
                slots.write(ids, pids[rid], c, c + m)
                slots.check(rid, ids, pids[rid], c + m, max(0, c - window + 1))
                req.num_computed_tokens = c + m
                kv.cache_blocks(req, c + m)
            elif kv.allocate_slots(req, min(n, left)) is None:
                kv.free(req, req.num_computed_tokens)  # preempted: recomputed later
                req.num_computed_tokens = 0
                continue
            else:
                c, m = req.num_computed_tokens, min(n, left)
                ids = [b.block_id for b in kv.req_to_blocks[rid]]
                slots.write(ids, pids[rid], c, c + m)
                slots.check(rid, ids, pids[rid], c + m, max(0, c - window + 1))
                req.num_computed_tokens = c + m
                kv.cache_blocks(req, c + m)
            done += 1
            if done == preempt_at:
                kv.free(req, req.num_computed_tokens)
                req.num_computed_tokens = 0
        # Pool accounting: each ref count is the number of tables holding the block, and the
        # blocks held plus the free queue are every block.
        holders: dict[int, int] = {}
        for r in reqs:
            for b in kv.req_to_blocks.get(r.request_id, []):
                if b is not OUT_OF_WINDOW:
                    holders[b.block_id] = holders.get(b.block_id, 0) + 1
        assert all(kv.pool.blocks[i].ref_cnt == n for i, n in holders.items())
        assert len(holders) + kv.num_free_blocks == 20
    for r in reqs:
        kv.free(r)
    assert kv.num_free_blocks == 20


def test_can_fit_counts_a_lone_sliding_group_by_its_window() -> None:
    """Issue 53 item 19: a Mistral-style model (one sliding group) admits requests longer than the pool."""
    window = 8
    kv = KVCacheManager(6, BS, sliding_window=window, max_step_tokens=8)
    # (8 - 1 + 8) // 4 + 2 = 5 blocks at most, whatever the length; full attention would need 250.
    assert kv.can_fit(1000)
    assert not KVCacheManager(4, BS, sliding_window=window, max_step_tokens=8).can_fit(1000)
    assert not KVCacheManager(6, BS, max_step_tokens=8).can_fit(1000)  # no window: every block


@settings(max_examples=50, deadline=None)
@given(window=st.integers(1, 24), budget=st.integers(1, 24), extra=st.integers(0, 3),
       prompts=st.lists(st.integers(1, 90), min_size=1, max_size=5),
       outs=st.lists(st.integers(1, 90), min_size=5, max_size=5),
       arrive=st.lists(st.integers(0, 12), min_size=5, max_size=5),
       caching=st.booleans(), spec_k=st.sampled_from([0, 0, 2]))
def test_a_pool_smaller_than_a_request_serves_it_by_the_window(window: int, budget: int, extra: int,
                                                              prompts: list[int], outs: list[int],
                                                              arrive: list[int], caching: bool, spec_k: int) -> None:
    """Admission by the window's bound never over-commits: every request finishes with its reference
    output, no step reads a freed or foreign slot (the FakeExecutor's slot model), the pool ends whole."""
    from twinserve.core import SchedulerConfig
    from twinserve.core.fake_executor import FakeExecutor
    from twinserve.core.spec_decode import SpeculativeConfig

    from .helpers import Arrival, drive, make_request, reference_output

    budget = max(budget, spec_k + 1)
    num_blocks = (window - 1 + budget) // BS + 2 + extra  # the bound, and a few blocks more
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=200, block_size=BS,
                          num_blocks=num_blocks, sliding_window=window, enable_prefix_caching=caching,
                          enable_chunked_prefill=True)
    arrivals = [Arrival(a, make_request(f"r{i}", [(i * 7 + j) % 50 + 2 for j in range(p)], o, ignore_eos=True))
                for i, (p, o, a) in enumerate(zip(prompts, outs, arrive))]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=spec_k) if spec_k else None
    core, log = drive(cfg, arrivals, spec=spec)
    ref = FakeExecutor(block_size=BS)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ref, a.request, cfg.max_model_len)
    assert core.scheduler.kv.num_free_blocks == num_blocks


def test_a_hit_longer_than_the_pool_is_admitted_by_its_window() -> None:
    """Every cached block hit, the pool full of them: the hits before the window are freed at once,
    so the step's new block fits (counting them all as taken refused it forever)."""
    window = 8
    kv = KVCacheManager(6, BS, enable_caching=True, sliding_window=window, max_step_tokens=8)
    prompt = list(range(2, 26))
    a = Request("a", prompt, SamplingParams(max_tokens=1))
    for n in (8, 8, 8):
        assert kv.allocate_slots(a, n) is not None
        a.num_computed_tokens += n
        kv.cache_blocks(a, a.num_computed_tokens)
    kv.free(a)
    b = Request("b", prompt + [99], SamplingParams(max_tokens=1))
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 24 and len(hits) == 6 and kv.num_free_blocks == 6
    assert kv.allocate_slots(b, 1, hits, num_hit) is not None
    assert kv.num_held_blocks("b") == held_by_formula(25, 24, window)


@pytest.mark.parametrize("window", [13, 17, 31])
@pytest.mark.parametrize("budget_over_window", [14, 15, -8])
@pytest.mark.parametrize("groups", [False, True], ids=["one-group", "full-and-sliding"])
def test_unaligned_windows_over_blocks_of_16_read_only_their_own_kv(window: int, budget_over_window: int,
                                                                    groups: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows 13, 17, 31 over blocks of 16: every freed block's slots are wiped before the step runs.

    A runner keeps a freed block's id and KV until the block is reused, so a drop one token early
    reads right until a reuse; wiping the slots at once (an immediate reuse) makes the slot model
    see it. A first chunk of W + 14 makes the next growth find c - W + 1 at a block's last slot."""
    from twinserve.core import SchedulerConfig
    from twinserve.core.fake_executor import FakeExecutor
    from twinserve.core.kv.block_pool import BlockPool

    from .helpers import Arrival, drive, make_request, reference_output

    bs = 16
    budget = window + budget_over_window
    lens = [(70, 40), (45, 30), (window + 20, 50)]
    if groups:
        # A full group beside two sliding ones: the full one needs the longest request whole.
        kw = dict(kv_groups=(0, window, window),
                  num_blocks=3 * (-(-max(p + o for p, o in lens) // bs) + (window - 1 + budget) // bs + 2))
    else:
        kw = dict(sliding_window=window, num_blocks=(window - 1 + budget) // bs + 2)  # the bound
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=3, max_model_len=200, block_size=bs,
                          enable_prefix_caching=False, enable_chunked_prefill=True, **kw)
    arrivals = [Arrival(i * 3, make_request(f"r{i}", [(i * 5 + j) % 50 + 2 for j in range(p)], o,
                                            ignore_eos=True))
                for i, (p, o) in enumerate(lens)]
    freed: list[int] = []
    free = BlockPool.free_blocks

    def free_and_record(pool: BlockPool, blocks) -> None:
        blocks = list(blocks)
        free(pool, blocks)
        freed.extend(b.block_id for b in blocks if b.ref_cnt == 0)

    def wipe(core, so, waiting_before) -> None:  # after schedule (which frees), before execute
        for block_id in freed:
            core.executor.kv.slots.pop(block_id, None)
        freed.clear()

    monkeypatch.setattr(BlockPool, "free_blocks", free_and_record)  # __slots__: patched on the class
    core, log = drive(cfg, arrivals, check=wipe)
    kv = core.scheduler.kv
    assert kv.num_window_freed > 0 and kv.num_free_blocks == cfg.num_blocks
    ref = FakeExecutor(block_size=bs)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ref, a.request, cfg.max_model_len)
