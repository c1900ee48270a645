"""Routers' documented tie and table rules (docs/test-audit.md, round 2)."""

from __future__ import annotations

from twinserve.core.routing import ReplicaLoad, RouteRequest, make_router
from twinserve.core.routing.policies import SessionAffinity


def _loads(*outstanding: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(i, o) for i, o in enumerate(outstanding)]


def test_least_outstanding_breaks_ties_by_the_lowest_index() -> None:
    r = make_router("least_outstanding")
    assert r.choose(RouteRequest("r"), _loads(2, 1, 1, 1)) == 1
    assert r.choose(RouteRequest("r"), _loads(0, 0, 0)) == 0


def test_the_session_table_forgets_the_least_recently_used_session_not_the_oldest_placed() -> None:
    r = SessionAffinity(max_sessions=2)
    reps = _loads(0, 0, 0)
    home = r.choose(RouteRequest("a0", session="a"), reps)
    r.choose(RouteRequest("b0", session="b"), reps)
    assert r.choose(RouteRequest("a1", session="a"), reps) == home  # a is now the most recent
    r.choose(RouteRequest("c0", session="c"), reps)                  # the table is full: b goes
    reps[home].outstanding = 9                                      # a's home is busy: only the table keeps a there
    assert r.choose(RouteRequest("a2", session="a"), reps) == home
