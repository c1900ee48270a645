"""The router seam: what a router sees, what it is asked, and its errors.

The simulated cluster and the real proxy call routers the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from twinserve.core.errors import TwinserveError


class NoReplicaAvailableError(TwinserveError, RuntimeError):
    """Every replica is out of rotation."""

    def __init__(self, num_replicas: int) -> None:
        super().__init__(f"no replica is available: all {num_replicas} are out of rotation; "
                         "check that the replicas are up and answer /health")


class UnknownRouterError(TwinserveError, ValueError):
    """A router name that is not one of ROUTER_NAMES."""
    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        super().__init__(f"unknown router {name!r}: choose one of {', '.join(known)}")


@dataclass(slots=True)
class ReplicaLoad:
    """One replica as a router sees it."""

    index: int
    outstanding: int = 0        # unfinished
    kv_usage: float = 0.0
    healthy: bool = True
    routed: int = 0             # ever


@dataclass(slots=True)
class RouteRequest:
    """What a router may read about one request."""
    request_id: str
    # Chained keys of the first full blocks (text chunks in the proxy).
    prefix_keys: tuple[int, ...] = ()
    session: str | None = None  # conversation id
    num_prompt_tokens: int = 0


class Router(Protocol):
    """Picks the replica for a request; returns its ReplicaLoad.index."""

    name: str
    # Whether the caller must fill prefix_keys (it costs hashes).
    needs_prefix_keys: bool

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        """The chosen replica's index (NoReplicaAvailableError if none)."""


def healthy(replicas: Sequence[ReplicaLoad]) -> list[ReplicaLoad]:
    """The replicas in rotation; NoReplicaAvailableError when there are none."""
    up = [r for r in replicas if r.healthy]
    if not up:
        raise NoReplicaAvailableError(len(replicas))
    return up


def least_loaded(replicas: Sequence[ReplicaLoad]) -> ReplicaLoad:
    """The healthy replica with the fewest outstanding (lowest index on ties)."""
    best = None
    for r in replicas:
        if r.healthy and (best is None or r.outstanding < best.outstanding):
            best = r
    if best is None:
        raise NoReplicaAvailableError(len(replicas))
    return best
