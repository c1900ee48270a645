"""Prefix-affinity routing: bounded-load consistent hashing of a request's leading KV blocks.

Shared prefixes land on the replica holding their KV; the load bound lets a hot prefix spill
along the ring instead of queueing on one replica.
Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass
from typing import Sequence

import xxhash

from twinserve.core.knobs import check_fields, knob
from twinserve.core.routing.base import ReplicaLoad, RouteRequest, least_loaded


@dataclass(slots=True)
class PrefixAffinityOptions:
    """prefix_affinity's own knobs."""

    # A block is a KV block in the simulator; the proxy has no tokenizer and hashes text chunks.
    prefix_blocks: int = knob(4, help="prefix_affinity: leading blocks of the prompt that name its prefix",
                              unit="blocks", range=(1, 1 << 16))
    load_factor: float = knob(1.25, help="prefix_affinity: no replica above this x the mean load "
                              "(1 = perfectly even)", range=(1.0, 1e3))

    def __post_init__(self) -> None:
        check_fields(self)


def _point(value: int, salt: int) -> int:
    return xxhash.xxh3_64_intdigest(value.to_bytes(8, "little", signed=False), salt)


def token_prefix_keys(token_ids: Sequence[int], block_size: int, max_blocks: int) -> tuple[int, ...]:
    """Chained keys of the first max_blocks full blocks."""
    keys = []
    parent = 0
    for b in range(min(max_blocks, len(token_ids) // block_size)):
        chunk = array("I", token_ids[b * block_size:(b + 1) * block_size]).tobytes()
        parent = xxhash.xxh3_64_intdigest(chunk, parent)
        keys.append(parent)
    return tuple(keys)


def text_prefix_keys(text: str, chunk_chars: int, max_blocks: int) -> tuple[int, ...]:
    """Chained keys of a text's first full chunks (a proxy has no tokenizer)."""
    data = text.encode("utf-8", "surrogatepass")
    keys = []
    parent = 0
    for b in range(min(max_blocks, len(data) // chunk_chars)):
        parent = xxhash.xxh3_64_intdigest(data[b * chunk_chars:(b + 1) * chunk_chars], parent)
        keys.append(parent)
    return tuple(keys)


class PrefixAffinity:
    """Bounded-load consistent hashing on the first prefix_blocks blocks."""

    name = "prefix_affinity"
    needs_prefix_keys = True

    def __init__(self, options: PrefixAffinityOptions | None = None, virtual_nodes: int = 64) -> None:
        options = PrefixAffinityOptions() if options is None else options
        self.prefix_blocks = options.prefix_blocks
        self.load_factor = options.load_factor
        self.virtual_nodes = virtual_nodes
        self._ring_for: tuple[int, ...] = ()
        self._points: list[int] = []
        self._owners: list[int] = []
        self.num_spills = 0  # choices moved off the home replica

    def _ring(self, indices: tuple[int, ...]) -> None:
        pts = sorted((_point(i, v), i) for i in indices for v in range(self.virtual_nodes))
        self._points = [p for p, _ in pts]
        self._owners = [i for _, i in pts]
        self._ring_for = indices

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        """The first replica clockwise from the prefix under the load bound."""
        keys = request.prefix_keys
        if not keys:  # nothing to share: balance the load
            return least_loaded(replicas).index
        indices = tuple(r.index for r in replicas)
        if indices != self._ring_for:
            self._ring(indices)
        key = keys[min(self.prefix_blocks, len(keys)) - 1]
        by_index = {r.index: r for r in replicas}
        up = [r for r in replicas if r.healthy]
        if not up:
            return least_loaded(replicas).index  # raises NoReplicaAvailableError
        total = sum(r.outstanding for r in up)
        cap = math.ceil(self.load_factor * (total + 1) / len(up))
        pts, owners = self._points, self._owners
        start = bisect.bisect_left(pts, _point(key, 0x5EED)) % len(pts)
        home = None
        seen: set[int] = set()
        for k in range(len(pts)):
            idx = owners[(start + k) % len(pts)]
            if idx in seen:
                continue
            seen.add(idx)
            r = by_index[idx]
            if not r.healthy:
                continue
            if home is None:
                home = idx
            if r.outstanding + 1 <= cap:
                if idx != home:
                    self.num_spills += 1
                return idx
            if len(seen) == len(indices):
                break
        return least_loaded(replicas).index
