"""Routers across engine replicas: one Protocol, shared by the simulated cluster and the proxy.

A router registered in ROUTERS, with its options dataclass if it has knobs of its own, is usable
from the simulator ([cluster] takes its options' fields), `twinserve route` (one flag each) and
the docs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from twinserve.core.knobs import knob
from twinserve.core.routing.base import (NoReplicaAvailableError, ReplicaLoad, RouteRequest, Router,
                   UnknownRouterError)
from twinserve.core.routing.policies import LeastKV, LeastOutstanding, PowerOfTwo, RoundRobin, SessionAffinity
from twinserve.core.routing.prefix import (PrefixAffinity, PrefixAffinityOptions, text_prefix_keys,
                                           token_prefix_keys)


@dataclass(frozen=True, slots=True)
class RouterEntry:
    """A registered router: its factory (seed, options or None) and its options dataclass."""

    factory: Callable[[int, Any], Router]
    options: type | None = None


ROUTERS: dict[str, RouterEntry] = {}


def register_router(name: str, factory: Callable[[int, Any], Router], options: type | None = None) -> None:
    """Add a router; its options' field names must not clash with another router's."""
    taken = router_option_fields()
    for f in dataclasses.fields(options) if options is not None else ():
        if f.name in taken and taken[f.name][0] is not options:
            raise ValueError(f"router option {f.name!r} of {name!r} is already another router's")
    ROUTERS[name] = RouterEntry(factory, options)


def router_option_fields() -> dict[str, tuple[type, dataclasses.Field]]:
    """Every registered router's option fields by name: (its options class, the field)."""
    out: dict[str, tuple[type, dataclasses.Field]] = {}
    for entry in ROUTERS.values():
        if entry.options is not None:
            for f in dataclasses.fields(entry.options):
                out.setdefault(f.name, (entry.options, f))
    return out


register_router("round_robin", lambda seed, opts: RoundRobin())
register_router("least_outstanding", lambda seed, opts: LeastOutstanding())
register_router("least_kv", lambda seed, opts: LeastKV())
register_router("power_of_two", lambda seed, opts: PowerOfTwo(seed))
register_router("prefix_affinity", lambda seed, opts: PrefixAffinity(opts), PrefixAffinityOptions)
register_router("session_affinity", lambda seed, opts: SessionAffinity())
ROUTER_NAMES = tuple(ROUTERS)


def make_router(name: str, seed: int = 0, **option_values: Any) -> Router:
    """A fresh router by registered name; option values of other routers are ignored."""
    entry = ROUTERS.get(name)
    if entry is None:
        raise UnknownRouterError(name, tuple(ROUTERS))
    opts = None
    if entry.options is not None:
        own = {f.name for f in dataclasses.fields(entry.options)}
        opts = entry.options(**{k: v for k, v in option_values.items() if k in own})
    return entry.factory(seed, opts)


def prefix_keys_needed(router: Router) -> int:
    """How many leading prefix keys the router reads (0 when it reads none)."""
    return getattr(router, "prefix_blocks", 1) if router.needs_prefix_keys else 0


@dataclass(slots=True)
class RouterConfig:
    """Which router spreads requests over replicas, and the values of routers' own options."""

    router: str = knob("round_robin", help="the router that picks a replica for each request",
                       choices=lambda: tuple(ROUTERS))
    # Option name -> value, for any registered router's options (only the chosen router's are used).
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self, seed: int = 0) -> Router:
        """A fresh router with these options."""
        return make_router(self.router, seed, **self.options)


__all__ = ["ROUTERS", "ROUTER_NAMES", "LeastKV", "LeastOutstanding", "NoReplicaAvailableError",
           "PowerOfTwo", "PrefixAffinity", "PrefixAffinityOptions", "ReplicaLoad", "RouteRequest",
           "RoundRobin", "Router", "RouterConfig", "RouterEntry", "SessionAffinity", "UnknownRouterError",
           "make_router", "prefix_keys_needed", "register_router", "router_option_fields", "text_prefix_keys", "token_prefix_keys"]
