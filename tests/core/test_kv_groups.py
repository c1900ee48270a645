"""KV cache groups: a full group and sliding groups over one pool (a Gemma-3-shaped model).

Pages in use follow the formula from the pool's counters; whole runs through the scheduler with
preemption, prefix hits and speculative rollback keep every group's reads on its own KV (the
FakeExecutor's slot oracle), and a planted extra free is caught; the prefix-hit restriction cuts a
hit where a sliding group's window blocks were evicted.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from twinserve.core import SchedulerConfig
from twinserve.core.errors import InvalidConfigError
from twinserve.core.fake_executor import ContractViolation, FakeExecutor
from twinserve.core.kv import KVCacheManager
from twinserve.core.kv.groups import group_windows, kv_cache_groups, layer_slots
from twinserve.core.kv.hashing import xxhash64
from twinserve.core.kv.kv_cache_manager import OUT_OF_WINDOW
from twinserve.core.request import Request
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import Arrival, drive, make_request, reference_output

BS = 4
W = 8
# Gemma 3 270M's layout: 18 layers, every 6th global.
GEMMA3_WINDOWS = [None if (i + 1) % 6 == 0 else W for i in range(18)]


def test_gemma3_layers_make_one_full_and_five_sliding_groups_of_three() -> None:
    groups = kv_cache_groups(GEMMA3_WINDOWS)
    assert [g.window for g in groups] == [None, W, W, W, W, W]
    assert all(len(g.layers) == 3 for g in groups)
    assert groups[0].layers == (5, 11, 17)
    assert sorted(layer for g in groups for layer in g.layers) == list(range(18))
    slots = layer_slots(groups)
    assert slots[5] == (0, 0) and slots[17] == (0, 2) and slots[0] == (1, 0)
    # Uniform models stay one group; coprime counts give one-layer groups.
    assert group_windows([None] * 4) == (0,) and group_windows([W] * 4) == (W,)
    assert group_windows([None, None, W]) == (0, 0, W)
    with pytest.raises(InvalidConfigError):
        kv_cache_groups([0, None])


def pages_by_formula(windows: tuple[int, ...], total: int, computed: int) -> int:
    """Pages one request holds after allocating up to `total` tokens with `computed` done."""
    n = -(-total // BS)
    return sum(n if w == 0 else n - max(0, computed - w + 1) // BS for w in windows)


def test_pages_in_use_follow_the_formula_at_8x_the_window() -> None:
    windows = group_windows(GEMMA3_WINDOWS)
    kv = KVCacheManager(200, BS, enable_caching=True, kv_groups=windows)
    req = Request("r", list(range(8 * W)), SamplingParams(max_tokens=1))
    for n in [5, 7, 1, 1, 13, 2] + [1] * 35:
        c = req.num_computed_tokens
        assert kv.allocate_slots(req, n) is not None
        req.num_computed_tokens = c + n
        kv.cache_blocks(req, c + n)
        assert kv.num_blocks - kv.num_free_blocks == pages_by_formula(windows, c + n, c)
    full = 8 * W // BS
    # Each sliding group ends with about a window's blocks, a sixth of the full group's here.
    assert kv.num_held_blocks("r", 0) == full
    assert all(kv.num_held_blocks("r", g) <= -(-W // BS) + 1 for g in range(1, 6))
    kv.free(req)
    assert kv.num_free_blocks == 200


def _run(windows: tuple[int, ...], num_blocks: int, stems: list[int], tails: list[int],
         out_lens: list[int], spec_k: int):
    cfg = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=6, max_model_len=128, block_size=BS,
                          num_blocks=num_blocks, kv_groups=windows)
    prefixes = [[7] * 13, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]]
    arrivals = [Arrival(i, make_request(f"r{i}", prefixes[s] + [t, i], n, ignore_eos=True))
                for i, (s, t, n) in enumerate(zip(stems, tails, out_lens))]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=spec_k) if spec_k else None
    core, log = drive(cfg, arrivals, spec=spec)
    ref = FakeExecutor(block_size=BS)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ref, a.request, cfg.max_model_len)
    assert core.scheduler.kv.num_free_blocks == num_blocks
    return core


@settings(max_examples=40, deadline=None)
@given(windows=st.sampled_from([(0, 3, 3), (0, 5), (0, 0, 6), (3, 9), (0, 1)]),
       num_blocks=st.integers(50, 64),
       stems=st.lists(st.integers(0, 1), min_size=4, max_size=6),
       tails=st.lists(st.integers(0, 9), min_size=6, max_size=6),
       out_lens=st.lists(st.integers(20, 60), min_size=6, max_size=6),
       spec_k=st.sampled_from([0, 0, 3]))
def test_runs_match_the_reference_and_read_only_their_own_kv(windows, num_blocks, stems, tails, out_lens,
                                                             spec_k) -> None:
    """Tight pools preempt; shared stems hit the prefix cache; drafts are trimmed on rejection."""
    core = _run(windows, num_blocks, stems, tails, out_lens, spec_k)
    kv = core.scheduler.kv
    event("preempted" if core.scheduler.num_preemptions else "no preemption")
    event("prefix hit" if kv.stats.hits else "no hit")
    event("window freed" if kv.num_window_freed else "nothing freed")


def test_a_planted_extra_free_in_a_sliding_group_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free one block too many (the last one before the window): the oracle must see the read."""
    real = KVCacheManager._drop_groups

    def drop_one_more(self, rid, tables, num_computed):
        real(self, rid, tables, num_computed + BS)

    _run((0, W), 30, [0, 1] * 3, [1, 2] * 3, [30] * 6, 0)  # fine as built
    monkeypatch.setattr(KVCacheManager, "_drop_groups", drop_one_more)
    with pytest.raises(ContractViolation, match="group 1"):
        _run((0, W), 30, [0, 1] * 3, [1, 2] * 3, [30] * 6, 0)


def _prefill(kv: KVCacheManager, req: Request) -> None:
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_hit, hits, num_hit) is not None
    req.num_computed_tokens = req.num_tokens
    kv.cache_blocks(req, req.num_tokens)


def test_a_hit_stops_where_a_sliding_group_lost_its_window_blocks() -> None:
    """The full group still caches A's first 4 blocks, but the sliding group's were evicted: no hit."""
    windows = (0, W)
    kv = KVCacheManager(20, BS, enable_caching=True, kv_groups=windows, lazy_registration=False)
    a = Request("a", list(range(100, 132)), SamplingParams(max_tokens=1))  # 8 blocks
    hits, _ = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 8, hits, 0) is not None  # 2 blocks per group
    for c in range(8, 32, 4):  # prefill in chunks: the sliding group drops what the window left
        a.num_computed_tokens = c
        kv.cache_blocks(a, c)
        assert kv.allocate_slots(a, 4) is not None
    a.num_computed_tokens = 32
    kv.cache_blocks(a, 32)
    dropped = [b for b in kv.pool.blocks if b.ref_cnt == 0 and b.block_hash is not None]
    assert dropped, "the sliding group returned the blocks behind its window"
    kv.free(a)
    # Pool pressure evicts the oldest free blocks first: the never-used ones, then those dropped.
    taken = kv.pool.get_new_blocks(4 + len(dropped))
    kv.pool.free_blocks(taken)
    b = Request("b", list(range(100, 116)) + [7, 7, 7], SamplingParams(max_tokens=1))
    hits, num_hit = kv.get_computed_blocks(b)
    # Group 0 alone would serve 4 blocks (16 tokens)...
    assert len(b.block_hashes) == 4
    assert all(kv.pool.get_cached_block(key) is not None for key in b.block_hashes)
    # ...but the sliding group's window at 16 tokens (blocks 2 and 3) is gone.
    assert num_hit < 16
    # Without eviction the same lookup would hit all 16 tokens.
    kv2 = KVCacheManager(40, BS, enable_caching=True, kv_groups=windows, lazy_registration=False)
    a2 = Request("a", list(range(100, 132)), SamplingParams(max_tokens=1))
    _prefill(kv2, a2)
    kv2.free(a2)
    b2 = Request("b", list(range(100, 116)) + [7, 7, 7], SamplingParams(max_tokens=1))
    hits2, num_hit2 = kv2.get_computed_blocks(b2)
    assert num_hit2 == 16
    # The sliding group's table part: placeholders before its window, cached blocks inside it.
    assert hits2.groups[1][:2] == [OUT_OF_WINDOW, OUT_OF_WINDOW]
    assert all(blk.block_hash is not None for blk in hits2.groups[1][2:])
    assert kv2.allocate_slots(b2, 3, hits2, num_hit2) is not None
    assert kv2.num_held_blocks("b", 1) == 3 and kv2.num_held_blocks("b", 0) == 5


def test_can_fit_counts_a_sliding_group_by_its_window() -> None:
    kv = KVCacheManager(30, BS, kv_groups=(0, W), max_step_tokens=8)
    # 100 tokens: 25 full-group pages + at most (W - 1 + 8) // BS + 2 = 5 sliding pages.
    assert kv.can_fit(100) and not kv.can_fit(104)
    assert not KVCacheManager(30, BS, kv_groups=(0, W)).can_fit(100)  # no step bound: as full


def test_config_rejects_bad_groups() -> None:
    with pytest.raises(InvalidConfigError, match="kv_groups"):
        SchedulerConfig(kv_groups=(0, -1))
    with pytest.raises(InvalidConfigError, match="sliding_window"):
        SchedulerConfig(kv_groups=(0, 8), sliding_window=8)


def _group_colliding_hash(parent, tokens, extra):
    """Group 0's keys stay apart; every other group's key is its group's alone (the group key is kept,
    the prefix is not), so group 1's blocks of two different prefixes collide."""
    if extra and extra[0] == "kv_group":
        return 1000 + extra[1]
    return xxhash64(parent, tokens, extra)


def test_a_group_hit_whose_key_collides_with_another_prefix_is_refused() -> None:
    """Group 1's key for A names B's block after B took it: A's group-0 hit must not take B's KV.

    Only the parent check tells the two apart (issue 53 item 14: a hit accepted without it read
    another prefix's KV and passed the tests, whose colliding hash ignored the group key)."""
    kv = KVCacheManager(20, BS, enable_caching=True, kv_groups=(0, 0), lazy_registration=False,
                        hash_function=_group_colliding_hash)
    a = Request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1))
    _prefill(kv, a)
    kv.free(a)
    b = Request("b", [9, 8, 7, 6, 5], SamplingParams(max_tokens=1))
    _prefill(kv, b)  # B's group-1 block takes the key value A's had
    kv.free(b)
    again = Request("a2", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1))
    hits, num_hit = kv.get_computed_blocks(again)
    assert kv.pool.get_cached_block(again.block_hashes[0]) is not None, "group 0 still caches A's block"
    for i, block in enumerate(getattr(hits, "groups", [[], []])[1]):
        assert block.block_hash.parent is again.block_hashes[i], f"group 1's block {i} holds another prefix"
    assert num_hit == 0  # A's group-1 block lost its key to B's: nothing to reuse
