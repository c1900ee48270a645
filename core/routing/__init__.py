"""Routers across engine replicas: one Protocol, shared by the simulated cluster and the proxy.

A router registered in ROUTERS is usable from the simulator, `twinserve route` and the docs.
"""

from __future__ import annotations

from typing import Callable

from twinserve.core.routing.base import (NoReplicaAvailableError, ReplicaLoad, RouteRequest, Router,
                   UnknownRouterError)
from twinserve.core.routing.policies import LeastKV, LeastOutstanding, PowerOfTwo, RoundRobin, SessionAffinity
from twinserve.core.routing.prefix import PrefixAffinity, text_prefix_keys, token_prefix_keys

# Factories take seed, prefix_blocks and load_factor, ignoring unused ones.
RouterFactory = Callable[..., Router]

ROUTERS: dict[str, RouterFactory] = {
    "round_robin": lambda seed, prefix_blocks, load_factor: RoundRobin(),
    "least_outstanding": lambda seed, prefix_blocks, load_factor: LeastOutstanding(),
    "least_kv": lambda seed, prefix_blocks, load_factor: LeastKV(),
    "power_of_two": lambda seed, prefix_blocks, load_factor: PowerOfTwo(seed),
    "prefix_affinity": lambda seed, prefix_blocks, load_factor: PrefixAffinity(prefix_blocks, load_factor),
    "session_affinity": lambda seed, prefix_blocks, load_factor: SessionAffinity(),
}
ROUTER_NAMES = tuple(ROUTERS)


def make_router(name: str, seed: int = 0, prefix_blocks: int = 4,
                load_factor: float = 1.25) -> Router:
    """A fresh router by registered name."""
    factory = ROUTERS.get(name)
    if factory is None:
        raise UnknownRouterError(name, ROUTER_NAMES)
    return factory(seed=seed, prefix_blocks=prefix_blocks, load_factor=load_factor)


__all__ = ["ROUTERS", "ROUTER_NAMES", "LeastKV", "LeastOutstanding", "NoReplicaAvailableError",
           "PowerOfTwo", "PrefixAffinity", "ReplicaLoad", "RouteRequest", "RoundRobin", "Router",
           "RouterFactory", "SessionAffinity", "UnknownRouterError", "make_router", "text_prefix_keys",
           "token_prefix_keys"]
