"""A decode replica's transferred requests join its decode steps (sim/disagg.DecodeExecutor, [cluster]
disagg_join_row "decode"): the one token past the transferred KV is priced as a decode row at the prompt's
context, and under the "mixed" policy an SGLang decode worker's decodes never wait for a join
(sim/validate_engines.py SGLANG_DECODE_JOINS; sim/validate_rows.py sets both on SGLang's decode replicas)."""

from __future__ import annotations

import pandas as pd
import pytest

from twinserve.sim.cluster_study import simulate_cluster
from twinserve.sim.disagg import _Discounted
from twinserve.sim.validate_engines import SGLANG_DECODE_JOIN_ROW, SGLANG_DECODE_JOINS
from twinserve.sim.validate_rows import load_rows, row_study

from .helpers import small_config

PROMPT, OUTPUT = 200, 40


def _run(join_row: str, policy: str, clients: int = 16):
    """1 prefill and 1 decode replica, fixed lengths; every step the decode replica's cost model priced,
    as the inner model's features (pt, ps, pc, pa, ds, dc), and the run's result."""
    cfg = small_config(concurrency=clients, num_requests=4 * clients, warmup_requests=0, num_replicas=2,
                       num_prefill_replicas=1, seed=3, max_model_len=1024, prompt_dist="fixed",
                       prompt_mean=PROMPT, output_dist="fixed", output_mean=OUTPUT, disagg_join_row=join_row,
                       batch_policy="prefill_first")
    cfg.cluster.replicas = [{}, {"scheduler.batch_policy": policy}]
    priced: list[tuple] = []
    inner = _Discounted.step_time

    def spy(self, pt, ps, pc, pa, ds, dc):
        a, b, c, d = self.minus
        e, f = self.plus
        priced.append((pt - a, ps - b, pc - c, pa - d, ds + e, dc + f))
        return inner(self, pt, ps, pc, pa, ds, dc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Discounted, "step_time", spy)
        built, res = simulate_cluster(cfg)
    assert len(res.total.records) == 4 * clients
    return priced, res


def test_join_token_is_a_decode_row_at_the_prompt_context():
    """With "decode", no decode-replica step carries a prefill feature: each joiner is one more decode row whose
    context is its transferred prompt; with "prefill" (the default) joiners are one-token prefill rows."""
    priced, _ = _run("decode", "mixed")
    assert priced and all(p[:4] == (0, 0, 0, 0.0) for p in priced)
    assert sum(p[4] for p in priced) > 0
    old, _ = _run("prefill", "mixed")
    rows = [p for p in old if p[1]]
    assert rows and all(p[0] == p[1] for p in rows)  # one token a prefill row: the old pricing


def test_joins_ride_with_the_decodes_under_mixed():
    """Under prefill_first a step that takes transferred requests runs them alone (its rows are the joiners', each
    at the prompt's context) and the running decodes wait; under the decode worker's "mixed" the running decodes
    are in that step too, and TPOT is lower at the same lengths."""
    lock_steps, lock = _run("decode", "prefill_first")
    ride_steps, ride = _run("decode", "mixed")
    # The steps the spy sees are the ones with joiners (decode-only steps run as windows, priced apart).
    assert lock_steps and all(p[5] == PROMPT * p[4] for p in lock_steps)
    assert any(p[5] > PROMPT * p[4] for p in ride_steps)

    def tpot(res) -> float:
        return float(pd.Series([(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
                                for r in res.total.records]).mean())

    assert tpot(ride) < tpot(lock)


@pytest.mark.parametrize("ranks", [1, 4])
def test_a_taking_rank_skips_its_decodes_under_attention_dp(ranks: int):
    """On a decode replica of `ranks` attention-DP ranks a step with j joiners is priced (1 + min(j, ranks) / ranks)
    times the inner model's step (the ranks that take requests run no decode of their own that iteration);
    without attention DP, or without joiners, at the inner model's price."""
    cfg = small_config(concurrency=24, num_requests=72, warmup_requests=0, num_replicas=2, num_prefill_replicas=1,
                       seed=3, max_model_len=1024, prompt_dist="fixed", prompt_mean=PROMPT, output_dist="fixed",
                       output_mean=OUTPUT, disagg_join_row="decode", batch_policy="prefill_first")
    cfg.cluster.replicas = [{}, {"scheduler.batch_policy": "mixed", "engine.data_parallel_size": ranks}]
    seen: list[tuple[int, float]] = []
    outer = _Discounted.step_time

    def spy(self, pt, ps, pc, pa, ds, dc):
        a, b, c, d = self.minus
        e, f = self.plus
        t = outer(self, pt, ps, pc, pa, ds, dc)
        seen.append((e, t / self.inner.step_time(pt - a, ps - b, pc - c, pa - d, ds + e, dc + f)))
        return t

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Discounted, "step_time", spy)
        simulate_cluster(cfg)
    joins = [(e, r) for e, r in seen if e]
    assert joins
    for e, r in seen:
        assert r == pytest.approx(1.0 + min(e, ranks) / ranks if e and ranks > 1 else 1.0)
    if ranks > 1:
        assert any(r > 1.0 for _, r in joins)


def test_sglang_disaggregated_rows_take_the_decode_worker_joins():
    """An SGLang disaggregated row's decode replicas run SGLANG_DECODE_JOINS with disagg_join_row "decode"; its
    prefill replicas keep SGLang's prefill_first; a TensorRT-LLM disaggregated row keeps the defaults."""
    d = load_rows()
    row = d[d["id"] == "2026_03_25_deepseek_r1_gb200_sglang_fp4_disagg_1024x1024_c512_tp4_0_ep4_0_842"].iloc[0]
    cfg = row_study(row, "aic")
    c = cfg.cluster
    assert c.disagg_join_row == SGLANG_DECODE_JOIN_ROW == "decode"
    assert SGLANG_DECODE_JOINS == "mixed"
    for i in range(c.num_replicas):
        want = SGLANG_DECODE_JOINS if i >= c.num_prefill_replicas else None
        assert c.replicas[i].get("scheduler.batch_policy") == want
    assert cfg.scheduler.batch_policy == "prefill_first"
    trt = d[(d["backend"] == "trtllm") & (d["mode"] == "disagg") & (d["model"] == "DeepSeek-R1")].iloc[0]
    tc = row_study(trt, "aic").cluster
    assert tc.disagg_join_row == "prefill"
    assert all("scheduler.batch_policy" not in r for r in tc.replicas)
