"""A follow-up turn reuses its previous turn's block keys (sim/world.py, _reuse_hashes): the run is
the same as one that hashes every turn's context afresh, with the tier on or off."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.build import build
from twinserve.sim.world import Simulation

from .helpers import fingerprint, time_limit
from .test_host_tier_sim import sessions


def _run(cfg, reuse: bool, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as m:
        reused = []
        original = Simulation._reuse_hashes

        def spy(self, req, *a):
            if reuse:
                original(self, req, *a)
                reused.append(len(req.block_hashes))

        m.setattr(Simulation, "_reuse_hashes", spy)
        built = build(cfg)
        with time_limit(120):
            res = built.simulation.run()
    kv = built.simulation.core.scheduler.kv
    host = None if kv.host is None else (kv.host.stats, sorted(kv.host.entries))
    return (fingerprint(res), kv.pool.num_evictions, host), reused


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.sampled_from([0, 64, 4096]),
       policy=st.sampled_from(["lru", "lrfu"]))
def test_reused_keys_change_nothing(seed: int, blocks: int, policy: str) -> None:
    """Records, steps, evictions and the tier's stats and entries equal those of a run without reuse."""
    monkeypatch = pytest.MonkeyPatch()
    cfg = sessions(**{"seed": seed, "kv_offload.host_blocks": blocks, "kv_offload.eviction": policy,
                      "num_requests": 12})
    with_reuse, reused = _run(cfg, True, monkeypatch)
    without, _ = _run(cfg, False, monkeypatch)
    assert with_reuse == without
    assert sum(reused) > 0  # follow-ups did get keys: the comparison is not vacuous
