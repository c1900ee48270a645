"""Load-balancing routers: round robin, least outstanding, least KV, power of two choices."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Sequence

from twinserve.core.routing.base import ReplicaLoad, RouteRequest, healthy, least_loaded


class RoundRobin:
    """Each healthy replica in turn, whatever its load."""

    name = "round_robin"
    needs_prefix_keys = False

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        """The next replica after the last one chosen, skipping those out of rotation."""
        n = len(replicas)
        for k in range(n):
            r = replicas[(self._next + k) % n]
            if r.healthy:
                self._next = (self._next + k + 1) % n
                return r.index
        healthy(replicas)  # raises
        raise AssertionError("unreachable")


class LeastOutstanding:
    """The replica with the fewest requests in flight (join the shortest queue)."""

    name = "least_outstanding"
    needs_prefix_keys = False

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        """Fewest outstanding requests; lowest index on ties."""
        return least_loaded(replicas).index


class LeastKV:
    """The replica whose KV cache is least full (outstanding requests break ties)."""

    name = "least_kv"
    needs_prefix_keys = False

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        """Lowest KV usage, then fewest outstanding, then lowest index."""
        return min(healthy(replicas), key=lambda r: (r.kv_usage, r.outstanding, r.index)).index


class PowerOfTwo:
    """Two replicas drawn at random, the less loaded one wins (Mitzenmacher's two choices)."""

    name = "power_of_two"
    needs_prefix_keys = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        """The less loaded of two distinct healthy replicas picked uniformly."""
        up = healthy(replicas)
        if len(up) == 1:
            return up[0].index
        a, b = self._rng.sample(up, 2)
        return (a if (a.outstanding, a.index) <= (b.outstanding, b.index) else b).index


class SessionAffinity:
    """A conversation's turns go to the replica that served its first turn.

    A new session (or one whose replica left rotation) goes to the least loaded replica, ties
    broken by the fewest sessions placed there, so sessions that arrive one at a time (every
    replica idle) still spread. The session table keeps the most recent max_sessions entries.
    """

    name = "session_affinity"
    needs_prefix_keys = False

    def __init__(self, max_sessions: int = 1 << 20) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._placed: dict[int, int] = {}  # replica index -> sessions in the table placed there

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        """The session's replica if it is in rotation, else the least loaded one."""
        s = request.session
        if s is None:
            return least_loaded(replicas).index
        known = self._sessions.get(s)
        if known is not None:
            for r in replicas:
                if r.index == known and r.healthy:
                    self._sessions.move_to_end(s)
                    return known
            self._placed[known] -= 1
        placed = self._placed
        chosen = min(healthy(replicas), key=lambda r: (r.outstanding, placed.get(r.index, 0), r.index)).index
        self._sessions[s] = chosen
        self._sessions.move_to_end(s)
        placed[chosen] = placed.get(chosen, 0) + 1
        if len(self._sessions) > self.max_sessions:
            _, old = self._sessions.popitem(last=False)
            placed[old] -= 1
        return chosen
