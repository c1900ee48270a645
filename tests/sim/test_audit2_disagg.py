"""Disaggregated prefill/decode gives each request exactly the output tokens its workload asked for
(docs/test-audit.md, round 2)."""

from __future__ import annotations

from twinserve.sim.build import build_workload
from twinserve.sim.cluster_study import simulate_cluster

from .helpers import small_config
from .test_cluster import DISAGG


def test_every_disaggregated_request_generates_its_workload_length_first_token_included() -> None:
    cfg = small_config(**{**DISAGG, "num_requests": 40})
    asked = {i.request_id: i.num_output_tokens for i in build_workload(cfg).items()}
    _, res = simulate_cluster(cfg)
    got = {r.request_id: (r.num_output_tokens, len(r.token_times)) for r in res.total.records}
    assert len(got) == 40 and any(n > 1 for n in asked.values())
    # The prefill replica's first token plus the decode replica's rest: not one more, not one less.
    assert got == {rid: (n, n) for rid, n in asked.items()}
