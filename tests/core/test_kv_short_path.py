"""allocate_slots' short path for a running request's block-filling step decides as its general path.

With one KV table, no sliding window and no host tier, a running request that needs a new block or
registers a full one skips the group, tier and window branches (issue 53 item 13: block-filling
steps had grown dearer than before speculative decoding). Forcing every such call down the general
path must change nothing: every step's schedule (blocks, preemptions, drafts) and every output.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinserve.core.kv import kv_cache_manager
from twinserve.core.spec_decode import SpeculativeConfig

from .helpers import drive
from .test_scheduler_properties import workloads


def _log_run(cfg, arrivals, spec, general: bool) -> tuple[list, dict]:
    """Every step's schedule as plain data, and each request's tokens; general forces the long path."""
    monkeypatch = pytest.MonkeyPatch()
    if general:
        init = kv_cache_manager.KVCacheManager.__init__

        def general_init(self, *args, **kwargs) -> None:
            init(self, *args, **kwargs)
            self._one_table = False

        monkeypatch.setattr(kv_cache_manager.KVCacheManager, "__init__", general_init)
    steps: list = []
    short_calls: list[bool] = []

    def check(core, so, waiting_before) -> None:
        kv = core.scheduler.kv
        short_calls.append(kv._one_table)
        c = so.scheduled_cached_reqs
        steps.append((dict(so.num_scheduled_tokens), list(c.req_ids), [list(b) for b in c.new_block_ids],
                      list(c.num_computed_tokens), list(so.preempted_req_ids),
                      [(n.req_id, list(n.block_ids), n.num_computed_tokens) for n in so.scheduled_new_reqs],
                      dict(so.scheduled_spec_decode_tokens), dict(so.num_dropped_blocks)))
        # The KV manager's state too: registered (cached or pending) blocks, the prefix-cache map.
        steps.append((dict(kv.num_cached_blocks), sorted((v, b.block_id) for v, b in kv.pool.cached.items()),
                      {rid: (ch.lo, ch.hi) for rid, ch in kv.pending_requests.items()}, kv.pool.num_free_blocks))

    try:
        _, log = drive(cfg, copy.deepcopy(arrivals), spec=spec, check=check)
    finally:
        monkeypatch.undo()
    assert all(s is not general for s in short_calls)  # the path asked for was the one taken
    return steps, log.outputs


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([0, 0, 2]))
def test_the_short_allocate_path_schedules_as_the_general_one(workload, k: int) -> None:
    """Fails on a planted off-by-one in the short path's free-block check, or drafts' blocks registered
    there (total for verified)."""
    cfg, arrivals = workload
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k) if k else None
    short = _log_run(cfg, arrivals, spec, False)
    general = _log_run(cfg, arrivals, spec, True)
    assert short == general


@pytest.mark.parametrize("kw", [dict(sliding_window=8), dict(kv_groups=(0, 8))])
def test_windows_and_groups_never_take_the_short_path(kw) -> None:
    """The short path skips the window drop and the per-group tables: a windowed or grouped manager
    must not take it."""
    kv = kv_cache_manager.KVCacheManager(64, 4, True, **kw)
    assert not kv._one_table
    assert kv_cache_manager.KVCacheManager(64, 4, True)._one_table
