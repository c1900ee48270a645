"""Router policies: each one's rule, health handling, and the bounded-load guarantee."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.core.routing.prefix import PrefixAffinityOptions
from twinserve.core.routing import (ROUTER_NAMES, NoReplicaAvailableError, PrefixAffinity,
                                    ReplicaLoad, RouteRequest, UnknownRouterError, make_router,
                                    text_prefix_keys, token_prefix_keys)


def loads(*outstanding: int, down: tuple[int, ...] = ()) -> list[ReplicaLoad]:
    return [ReplicaLoad(i, o, healthy=i not in down) for i, o in enumerate(outstanding)]


def req(i: int = 0, keys: tuple[int, ...] = (), session: str | None = None) -> RouteRequest:
    return RouteRequest(f"r{i}", keys, session)


def test_round_robin_cycles_and_skips_replicas_out_of_rotation() -> None:
    r = make_router("round_robin")
    reps = loads(0, 0, 0)
    assert [r.choose(req(), reps) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    reps[1].healthy = False
    assert [r.choose(req(), reps) for _ in range(4)] == [0, 2, 0, 2]


def test_least_outstanding_and_least_kv_pick_the_lightest() -> None:
    assert make_router("least_outstanding").choose(req(), loads(3, 1, 2)) == 1
    assert make_router("least_outstanding").choose(req(), loads(3, 1, 0, down=(2,))) == 1
    reps = loads(1, 1, 1)
    reps[0].kv_usage, reps[1].kv_usage, reps[2].kv_usage = 0.9, 0.2, 0.5
    assert make_router("least_kv").choose(req(), reps) == 1


def test_power_of_two_never_picks_the_single_busiest_replica() -> None:
    r = make_router("power_of_two", seed=3)
    reps = loads(9, 1, 2, 3)
    picks = Counter(r.choose(req(), reps) for _ in range(400))
    assert picks[0] == 0 and len(picks) == 3


def test_session_affinity_keeps_turns_together_until_the_replica_goes_down() -> None:
    r = make_router("session_affinity")
    reps = loads(0, 0, 0)
    first = r.choose(req(session="a"), reps)
    reps[first].outstanding += 5  # busy: a least-loaded router would move on
    assert all(r.choose(req(session="a"), reps) == first for _ in range(5))
    assert r.choose(req(session="b"), reps) != first
    reps[first].healthy = False
    moved = r.choose(req(session="a"), reps)
    assert moved != first and r.choose(req(session="a"), reps) == moved


def test_every_router_refuses_clearly_when_all_replicas_are_down() -> None:
    for name in ROUTER_NAMES:
        with pytest.raises(NoReplicaAvailableError, match="out of rotation"):
            make_router(name).choose(req(keys=(1, 2), session="s"), loads(0, 0, down=(0, 1)))
    with pytest.raises(UnknownRouterError, match="round_robin"):
        make_router("random")


def test_prefix_keys_are_chained_and_stop_at_full_blocks() -> None:
    a = token_prefix_keys(list(range(100)), 16, 4)
    b = token_prefix_keys(list(range(40)) + [0] * 60, 16, 4)
    assert len(a) == 4 and a[:2] == b[:2] and a[2] != b[2]
    assert token_prefix_keys(list(range(15)), 16, 4) == ()
    # A change in block 0 changes every later key (the keys name whole prefixes).
    c = token_prefix_keys([99] + list(range(1, 100)), 16, 4)
    assert all(x != y for x, y in zip(a, c))
    assert text_prefix_keys("x" * 130, 64, 4) == text_prefix_keys("x" * 128 + "yz", 64, 4)


def test_prefix_affinity_sends_a_prefix_home_and_spreads_distinct_prefixes() -> None:
    r = PrefixAffinity(PrefixAffinityOptions(prefix_blocks=2, load_factor=1.25))
    reps = loads(0, 0, 0, 0)
    homes = {}
    for p in range(64):
        keys = token_prefix_keys([p] * 64, 16, 4)
        homes[p] = r.choose(req(keys=keys), reps)
        assert r.choose(req(keys=keys), reps) == homes[p]  # idle cluster: always home
    assert len(set(homes.values())) == 4
    # Keys past prefix_blocks do not matter: same first two blocks, same replica.
    k1 = token_prefix_keys([5] * 32 + [1] * 32, 16, 4)
    k2 = token_prefix_keys([5] * 32 + [2] * 32, 16, 4)
    assert r.choose(req(keys=k1), reps) == r.choose(req(keys=k2), reps)


def test_a_hot_prefix_spills_instead_of_swamping_its_replica() -> None:
    r = PrefixAffinity(PrefixAffinityOptions(prefix_blocks=1, load_factor=1.25))
    reps = loads(0, 0, 0, 0)
    keys = token_prefix_keys([7] * 16, 16, 1)
    for _ in range(100):  # one prefix, nothing finishes
        reps[r.choose(req(keys=keys), reps)].outstanding += 1
    counts = [x.outstanding for x in reps]
    assert max(counts) <= math.ceil(1.25 * 100 / 4)
    assert min(counts) > 0 and r.num_spills > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=8),
       st.lists(st.booleans(), min_size=8, max_size=8),
       st.integers(0, 2**63), st.sampled_from([1.0, 1.25, 2.0]))
def test_bounded_load_rule_holds(outstanding, up, key, c) -> None:
    reps = [ReplicaLoad(i, o, healthy=up[i]) for i, o in enumerate(outstanding)]
    if not any(x.healthy for x in reps):
        reps[0].healthy = True
    r = PrefixAffinity(PrefixAffinityOptions(prefix_blocks=1, load_factor=c))
    chosen = reps[r.choose(req(keys=(key,)), reps)]
    live = [x for x in reps if x.healthy]
    cap = math.ceil(c * (sum(x.outstanding for x in live) + 1) / len(live))
    assert chosen.healthy
    if any(x.outstanding + 1 <= cap for x in live):
        assert chosen.outstanding + 1 <= cap


@settings(max_examples=100, deadline=None)
@given(prefix_blocks=st.integers(1, 5), num_replicas=st.integers(2, 6), block=st.integers(1, 4),
       shared=st.integers(0, 99), extra=st.integers(0, 3),
       seed=st.integers(0, 2**16))
def test_prefix_affinity_keys_on_exactly_prefix_blocks_blocks(prefix_blocks, num_replicas, block, shared,
                                                              extra, seed) -> None:
    """Requests agreeing on their first prefix_blocks blocks share a replica whatever follows;
    32 prefixes that share only the first block (prefix_blocks >= 2) spread over replicas."""
    r = PrefixAffinity(PrefixAffinityOptions(prefix_blocks=prefix_blocks))
    reps = loads(*[0] * num_replicas)  # idle: every prefix goes to its home replica
    first = [shared] * block
    depth = prefix_blocks + extra
    homes = []
    for p in range(32):
        tail = [1000 + seed + p * 7 + j for j in range((depth - 1) * block)]
        keys = token_prefix_keys(first + tail, block, depth)
        home = r.choose(req(keys=keys), reps)
        homes.append(home)
        # Blocks past prefix_blocks (changed, dropped or added) do not move the request.
        cut = keys[:prefix_blocks]
        other = token_prefix_keys(first + tail[:(prefix_blocks - 1) * block] + [5] * (3 * block), block,
                                  prefix_blocks + 3)
        assert other[:prefix_blocks] == cut
        assert r.choose(req(keys=cut), reps) == home
        assert r.choose(req(keys=other), reps) == home
    if prefix_blocks >= 2:
        assert len(set(homes)) >= 2, "prefixes that differ in block 2 all went to one replica"


def test_session_affinity_spreads_sessions_that_arrive_one_at_a_time() -> None:
    r = make_router("session_affinity")
    reps = loads(0, 0, 0)
    homes = {s: r.choose(req(session=s), reps) for s in "abcdef"}  # nothing in flight between them
    assert Counter(homes.values()) == {0: 2, 1: 2, 2: 2}
    assert all(r.choose(req(session=s), reps) == home for s, home in homes.items())
