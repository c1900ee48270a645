"""The host tier's batched hot paths (store_many, pin_many) and the inlined xxhash64 agree with
the one-at-a-time originals: same slots, same entries, same eviction order, same hash values."""

from __future__ import annotations

import xxhash
from hypothesis import given
from hypothesis import strategies as st

from twinserve.core.kv.hashing import BlockHash, _seed, _to_bytes, xxhash64
from twinserve.core.kv.host_tier import HostTier

# Few values and two token contents per value: equal keys, colliding keys and new ones all occur.
_keys = st.builds(lambda v, t, parent: BlockHash(v, parent, (t,), None),
                  st.integers(0, 6), st.integers(0, 1),
                  st.sampled_from([None, BlockHash(99, None, (1,), None)]))
_ops = st.lists(st.tuples(st.sampled_from(["store", "pin", "unpin"]), st.lists(_keys, max_size=6)),
                max_size=25)


def _state(tier: HostTier) -> tuple:
    """Everything store/pin may change, eviction order included (the victim with nothing pinned)."""
    return (sorted((v, s, k) for v, (s, k) in tier.entries.items()), sorted(tier.free_slots),
            dict(tier.pins), tier.stats, tier.policy.victim(tier.pins))


@given(num_blocks=st.integers(1, 5), policy=st.sampled_from(["lru", "lrfu"]), ops=_ops)
def test_store_many_and_pin_many_match_store_and_pin(num_blocks, policy, ops):
    """Interleaved batches through the fast paths leave the tier exactly as single calls do."""
    one, many = HostTier(num_blocks, policy), HostTier(num_blocks, policy)
    for op, keys in ops:
        if op == "store":
            expect = [(i, s) for i, k in enumerate(keys) if (s := one.store(k)) is not None]
            got: list[tuple[int, int]] = []
            many.store_many(list(enumerate(keys)), got)
            assert got == expect
        elif op == "pin":
            held = [k for k in keys if k.value in one.entries]
            for k in held:
                one.pin(k.value)
            many.pin_many(held)
        else:
            for k in keys:
                if k.value in one.pins:
                    one.unpin(k.value)
                    many.unpin(k.value)
        assert _state(one) == _state(many)


@given(tokens=st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=20),
       parent=st.one_of(st.none(), st.integers(-2**70, 2**70)),
       extra=st.sampled_from([None, (), ("salt",), (1, 2)]))
def test_inlined_xxhash64_matches_its_definition(tokens, parent, extra):
    """xxh3-64 of the packed ids (and extra keys' repr) seeded by the parent, as before inlining."""
    for _ in range(2):  # the packer made on the first call, reused on the second
        assert xxhash64(parent, tuple(tokens), extra) == xxhash.xxh3_64_intdigest(
            _to_bytes(tokens, extra), _seed(parent))


class _ListLRUTier:
    """A plain reference for the LRU tier: a list oldest first, a linear scan per operation."""

    def __init__(self, num_blocks: int) -> None:
        self.order: list[tuple[int, int, BlockHash]] = []  # (value, slot, key), oldest first
        self.free = list(range(num_blocks - 1, -1, -1))
        self.pins: dict[int, int] = {}
        self.evictions = 0

    def _find(self, value: int) -> int | None:
        return next((i for i, e in enumerate(self.order) if e[0] == value), None)

    def store(self, key: BlockHash) -> int | None:
        i = self._find(key.value)
        if i is not None:
            if self.order[i][2] == key:
                self.order.append(self.order.pop(i))
                return None
            if key.value in self.pins:
                return None
            self.free.append(self.order.pop(i)[1])
        if self.free:
            slot = self.free.pop()
        else:
            j = next((j for j, e in enumerate(self.order) if e[0] not in self.pins), None)
            if j is None:
                return None
            slot = self.order.pop(j)[1]
            self.evictions += 1
        self.order.append((key.value, slot, key))
        return slot

    def pin(self, value: int) -> None:
        self.pins[value] = self.pins.get(value, 0) + 1
        self.order.append(self.order.pop(self._find(value)))


@given(num_blocks=st.integers(1, 5), ops=_ops)
def test_lru_store_many_matches_a_list_model(num_blocks, ops):
    """The LRU tier's inlined store_many (entries kept in LRU order, pinned oldest entries skipped)
    gives the slots, contents, order and eviction count of a plain list model."""
    tier, ref = HostTier(num_blocks, "lru"), _ListLRUTier(num_blocks)
    for op, keys in ops:
        if op == "store":
            expect = [(i, s) for i, k in enumerate(keys) if (s := ref.store(k)) is not None]
            got: list[tuple[int, int]] = []
            tier.store_many(list(enumerate(keys)), got)
            assert got == expect
        elif op == "pin":
            held = [k for k in keys if ref._find(k.value) is not None]
            for k in held:
                ref.pin(k.value)
            tier.pin_many(held)
        else:
            for k in keys:
                if k.value in ref.pins:
                    ref.pins[k.value] -= 1
                    if not ref.pins[k.value]:
                        del ref.pins[k.value]
                    tier.unpin(k.value)
        assert [(v, s, k) for v, (s, k) in tier.entries.items()] == ref.order
        assert tier.stats.evictions == ref.evictions and tier.pins == ref.pins


def _first_blocks_collide(parent, tokens, extra):
    """Every prompt's first block has value 1; a later block's value is its parent's value and tokens."""
    return 1 if parent is None else (parent * 31 + sum(tokens)) % 1000 + 2


def test_the_host_walk_refuses_an_entry_whose_parent_is_another_prefix():
    """_host_hits matches an entry by tokens, extra keys AND parent (HostTier.lookup's check, inlined there
    when lookup was removed as unused). Prompts a and b differ in block 0, whose values collide, and share
    block 1's tokens, so b's block 1 has a's block 1's value: that host entry holds a's KV, not b's."""
    from twinserve.core.kv import KVCacheManager
    from twinserve.core.request import Request
    from twinserve.core.sampling_params import SamplingParams

    kv = KVCacheManager(3, 4, hash_function=_first_blocks_collide, host_tier=HostTier(8))

    def run(rid: str, tokens: list[int]) -> None:
        req = Request(rid, tokens, SamplingParams(max_tokens=4))
        hits, num_hit = kv.get_computed_blocks(req)
        assert kv.allocate_slots(req, req.num_tokens - num_hit, hits, num_hit) is not None
        req.num_computed_tokens = req.num_tokens
        kv.cache_blocks(req, req.num_tokens)
        kv.free(req)
        kv.take_transfers()

    run("a", [1, 1, 1, 1, 5, 6, 7, 8, 9])
    run("b", [2, 2, 2, 2, 5])  # 3 device blocks: a's are evicted, its block 1 goes to the host tier
    shared = _first_blocks_collide(1, (5, 6, 7, 8), None)
    assert list(kv.host.entries) == [shared] and kv.host.entries[shared][1].token_ids == (5, 6, 7, 8)
    b2 = Request("b2", [2, 2, 2, 2, 5, 6, 7, 8, 9], SamplingParams(max_tokens=4))
    hits, num_hit = kv.get_computed_blocks(b2)
    assert num_hit == 4 and getattr(hits, "host", None) is None  # b's own block 0 only, no load of a's KV
