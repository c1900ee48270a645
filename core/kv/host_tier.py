"""The host-memory tier behind the device block pool: full blocks' KV kept by their block hash.

The tier is bookkeeping only: which host slot holds which prefix block. The executor moves the
bytes (SchedulerOutput.kv_stores / kv_loads). A slot with a load in flight is pinned: it is
never evicted or overwritten before the load completes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from twinserve.core.errors import InvalidConfigError
from twinserve.core.kv.hashing import BlockHash
from twinserve.core.kv.host_policies import LRUHostPolicy, make_host_policy


@dataclass(slots=True)
class HostTierStats:
    """Host-tier counters: lookups in tokens (vLLM's external prefix cache), transfers in blocks."""

    queries: int = 0
    hits: int = 0
    blocks_stored: int = 0
    blocks_loaded: int = 0
    evictions: int = 0
    # A store skipped: every slot pinned by loads in flight.
    stores_dropped: int = 0


class HostTier:
    """num_blocks host slots, each holding one full block's KV under its key."""

    __slots__ = ("num_blocks", "policy_name", "policy", "entries", "free_slots", "pins", "stats", "_access",
                 "_lru")

    def __init__(self, num_blocks: int, policy: str = "lru") -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise InvalidConfigError("kv_offloading_blocks", num_blocks, "an integer >= 1 (one block at least)")
        self.num_blocks = num_blocks
        self.policy_name = policy
        self.policy = make_host_policy(policy, num_blocks)
        # Key value -> (slot, key): the key confirms a hit by its whole prefix.
        self.entries: dict[int, tuple[int, BlockHash]] = {}
        # LRU: the entries' own order is the policy's (oldest first), so a store, drop or access
        # is one dict operation, with no policy call per block (hot path).
        self._lru = type(self.policy) is LRUHostPolicy
        if self._lru:
            self.entries = self.policy._order = OrderedDict()
        self._access = self.entries.move_to_end if self._lru else self.policy.access
        self.free_slots = list(range(num_blocks - 1, -1, -1))
        # Key value -> loads in flight reading its slot.
        self.pins: dict[int, int] = {}
        self.stats = HostTierStats()

    def __len__(self) -> int:
        return len(self.entries)

    def store(self, key: BlockHash) -> int | None:
        """A slot to copy key's block into; None when the tier has it already or every slot is pinned."""
        value = key.value
        entry = self.entries.get(value)
        if entry is not None:
            if entry[1] is key or entry[1] == key:
                self._access(value)
                return None  # the same KV is here: nothing to copy
            if value in self.pins:
                self.stats.stores_dropped += 1
                return None  # a colliding key is being read: keep it
            self.free_slots.append(self._drop(value))  # the new key takes its value
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            victim = self.policy.victim(self.pins)
            if victim is None:
                self.stats.stores_dropped += 1
                return None
            slot = self._drop(victim)
            self.stats.evictions += 1
        self.entries[value] = (slot, key)  # LRU: newest at the back
        if not self._lru:
            self.policy.insert(value)
        self.stats.blocks_stored += 1
        return slot

    def store_many(self, evicted: list[tuple[int, BlockHash]], out: list[tuple[int, int]]) -> None:
        """store() each (block id, key) in order, appending (block id, slot) to out for each copy."""
        if not self._lru:
            self._store_each(evicted, out)
            return
        # LRU with store() inlined (the hottest loop of a tiered run): the same slots, entries and
        # order; a colliding value or a pinned oldest entry takes store()'s general path.
        entries = self.entries
        get = entries.get
        move = entries.move_to_end
        pop_oldest = entries.popitem
        free = self.free_slots
        pins = self.pins
        store = self.store
        add = out.append
        stored = evictions = 0
        for block_id, key in evicted:
            value = key[0]
            entry = get(value)
            if entry is not None:
                if entry[1] is key or entry[1] == key:
                    move(value)  # the same KV is here: nothing to copy
                    continue
                slot = store(key)
            elif free:
                slot = free.pop()
                entries[value] = (slot, key)
                stored += 1
            else:
                victim, entry = pop_oldest(False)
                if pins and victim in pins:
                    entries[victim] = entry  # back to the front: store() skips pinned entries
                    move(victim, False)
                    slot = store(key)
                else:
                    slot = entry[0]
                    entries[value] = (slot, key)
                    stored += 1
                    evictions += 1
            if slot is not None:
                add((block_id, slot))
        stats = self.stats
        stats.blocks_stored += stored
        stats.evictions += evictions

    def _store_each(self, evicted: list[tuple[int, BlockHash]], out: list[tuple[int, int]]) -> None:
        """store_many for any policy."""
        entries = self.entries
        get = entries.get
        access = self._access
        store = self.store
        add = out.append
        for block_id, key in evicted:
            # The common case inlined (hot path): the tier holds this very prefix already.
            entry = get(key.value)
            if entry is not None and (entry[1] is key or entry[1] == key):
                access(key.value)
                continue
            slot = store(key)
            if slot is not None:
                add((block_id, slot))

    def pin_many(self, keys: list[BlockHash]) -> None:
        """pin() each key's entry, in order."""
        pins = self.pins
        get = pins.get
        access = self._access
        for key in keys:
            value = key[0]
            pins[value] = get(value, 0) + 1
            access(value)
        self.stats.blocks_loaded += len(keys)

    def _drop(self, value: int) -> int:
        """Remove an unpinned entry; its slot."""
        slot, _ = self.entries.pop(value)
        if not self._lru:
            self.policy.remove(value)
        return slot

    def pin(self, value: int) -> None:
        """A load reads this entry's slot: keep it until unpin."""
        self.pins[value] = self.pins.get(value, 0) + 1
        self._access(value)
        self.stats.blocks_loaded += 1

    def unpin(self, value: int) -> None:
        """A load from this entry finished."""
        n = self.pins[value] - 1
        if n:
            self.pins[value] = n
        else:
            del self.pins[value]

    def clear(self) -> None:
        """Forget every entry (refused while loads are in flight)."""
        if self.pins:
            raise AssertionError(f"clearing the host tier with {len(self.pins)} loads in flight")
        if not self._lru:
            for value in self.entries:
                self.policy.remove(value)
        self.entries.clear()
        self.free_slots = list(range(self.num_blocks - 1, -1, -1))
