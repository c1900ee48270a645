"""Routers across engine replicas: one Protocol, shared by the simulated cluster and the proxy."""

from __future__ import annotations

from twinserve.core.routing.base import (NoReplicaAvailableError, ReplicaLoad, RouteRequest, Router,
                   UnknownRouterError)
from twinserve.core.routing.policies import LeastKV, LeastOutstanding, PowerOfTwo, RoundRobin, SessionAffinity
from twinserve.core.routing.prefix import PrefixAffinity, text_prefix_keys, token_prefix_keys

ROUTER_NAMES = ("round_robin", "least_outstanding", "least_kv", "power_of_two",
                "prefix_affinity", "session_affinity")


def make_router(name: str, seed: int = 0, prefix_blocks: int = 4,
                load_factor: float = 1.25) -> Router:
    """A fresh router by name (UnknownRouterError for other names)."""
    if name == "round_robin":
        return RoundRobin()
    if name == "least_outstanding":
        return LeastOutstanding()
    if name == "least_kv":
        return LeastKV()
    if name == "power_of_two":
        return PowerOfTwo(seed)
    if name == "prefix_affinity":
        return PrefixAffinity(prefix_blocks, load_factor)
    if name == "session_affinity":
        return SessionAffinity()
    raise UnknownRouterError(name, ROUTER_NAMES)


__all__ = ["ROUTER_NAMES", "LeastKV", "LeastOutstanding", "NoReplicaAvailableError",
           "PowerOfTwo", "PrefixAffinity", "ReplicaLoad", "RouteRequest", "RoundRobin", "Router",
           "SessionAffinity", "UnknownRouterError", "make_router", "text_prefix_keys",
           "token_prefix_keys"]
