"""Eviction order of the host tier: named policies, registered like the scheduler's.

A policy sees the tier's entries as key values; the tier tells it of inserts, accesses and
removals, and asks for a victim among the unpinned entries. Time is logical: the count of
accesses, so the order is the same in the engine and the simulator.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from typing import Callable, Container, Protocol

from twinserve.core.errors import InvalidConfigError


class HostEvictionPolicy(Protocol):
    """Chooses which host-tier entry gives its slot up."""

    def insert(self, value: int) -> None:
        """A new entry (counts as its first access)."""

    def access(self, value: int) -> None:
        """An entry was hit or stored again."""

    def remove(self, value: int) -> None:
        """An entry left the tier (evicted or cleared)."""

    def victim(self, pinned: Container[int]) -> int | None:
        """The entry to evict, never a pinned one; None when every entry is pinned."""


class LRUHostPolicy:
    """Least recently used first."""

    __slots__ = ("_order",)

    def __init__(self, capacity: int) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def insert(self, value: int) -> None:
        """Newest at the back."""
        self._order[value] = None

    def access(self, value: int) -> None:
        """Move to the back."""
        self._order.move_to_end(value)

    def remove(self, value: int) -> None:
        """Forget value."""
        del self._order[value]

    def victim(self, pinned: Container[int]) -> int | None:
        """The oldest unpinned entry (pins are few: loads in flight)."""
        for value in self._order:
            if value not in pinned:
                return value
        return None


class LRFUHostPolicy:
    """Reuse-aware: frequency and recency in one score (LRFU's combined recency and frequency).

    Each access adds 1 to a score that halves every half_life accesses; the lowest score goes.
    A block reused across many sessions outlives a burst of one-off prefixes, which pure LRU
    lets flush it. LRFU: Lee et al., IEEE Trans. Computers 50(12), 2001. Marconi (Pan et al.,
    arXiv 2411.19379) argues for reuse-aware prefix-cache eviction in the same spirit (its score
    weighs recency with FLOP efficiency). Kept in the log domain, a score's order never changes
    between accesses, so a heap with lazy deletion finds the victim.
    """

    __slots__ = ("_rate", "_score", "_last", "_heap", "_now")

    def __init__(self, capacity: int, half_life: float | None = None) -> None:
        # One tier's worth of accesses by default: a block must be reused within about that.
        self._rate = 1.0 / float(half_life or max(capacity, 1))
        self._score: dict[int, float] = {}  # log2 of the score at the last access
        self._last: dict[int, int] = {}
        self._heap: list[tuple[float, int, int]] = []
        self._now = 0

    def _key(self, value: int) -> float:
        # log2(score at time t) + rate * t ranks entries the same for every later t.
        return self._score[value] + self._rate * self._last[value]

    def insert(self, value: int) -> None:
        """Score 1 now."""
        self._now += 1
        self._score[value] = 0.0
        self._last[value] = self._now
        heapq.heappush(self._heap, (self._key(value), self._now, value))

    def access(self, value: int, _log2=math.log2, _push=heapq.heappush) -> None:
        """Decay the score to now and add 1."""
        now = self._now = self._now + 1
        rate = self._rate
        decayed = self._score[value] - rate * (now - self._last[value])
        # log2(1 + 2**decayed), stable for very negative decayed.
        score = self._score[value] = decayed + _log2(1.0 + 2.0 ** -decayed) if decayed > -60 else 0.0
        self._last[value] = now
        _push(self._heap, (score + rate * now, now, value))  # _key(value), inlined (hot path)

    def remove(self, value: int) -> None:
        """Forget value (its heap entries go stale)."""
        del self._score[value]
        del self._last[value]

    def victim(self, pinned: Container[int]) -> int | None:
        """The lowest-scored unpinned entry."""
        heap = self._heap
        kept = []
        found = None
        while heap:
            _, stamp, value = heap[0]
            if self._last.get(value) != stamp:
                heapq.heappop(heap)  # stale: accessed again or removed
                continue
            if value in pinned:
                kept.append(heapq.heappop(heap))
                continue
            found = value
            break
        for entry in kept:
            heapq.heappush(heap, entry)
        if len(heap) > 4 * len(self._last) + 64:  # drop stale entries now and then
            self._heap = [e for e in heap if self._last.get(e[2]) == e[1]]
            heapq.heapify(self._heap)
        return found


# Registry read by the scheduler config, the simulator, the CLIs and docs/knobs.md.
HOST_EVICTION_POLICIES: dict[str, Callable[[int], HostEvictionPolicy]] = {
    "lru": LRUHostPolicy,
    "lrfu": LRFUHostPolicy,
}


def make_host_policy(name: str, capacity: int) -> HostEvictionPolicy:
    """A host-tier eviction policy by name."""
    factory = HOST_EVICTION_POLICIES.get(name)
    if factory is None:
        raise InvalidConfigError("kv_offloading_policy", name, " or ".join(HOST_EVICTION_POLICIES))
    return factory(capacity)
