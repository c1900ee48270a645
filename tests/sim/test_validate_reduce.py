"""`simulate validate --reduce replicas`: a disaggregated row's cluster simulated as a 1/g slice."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.config import StudyConfig
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_reduce import NONE, REPLICAS, Slice, reduce_study, slice_factor, slice_row
from twinserve.sim.validate_rows import closed_loop_available, row_study

pytestmark = pytest.mark.skipif(not closed_loop_available(), reason="slices need closed-loop clients")

# DeepSeek-R1 H200 TensorRT-LLM disaggregated 1k/1k, 1,024 clients, no worker counts in the row (two srt-slurm
# recipes with other workers give 1,024: sim/validate_inferencex.py): the KV-balanced count assumption
# (kv_fit_rate) gives 2 prefill + 2 decode workers at H200's 143,771 MiB (a development row). (8k/1k at 256, the
# row used before, is settled by its recipe: 3 prefill, 1 decode.)
DISAGG_2P2D = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c1024_tp8_0_ep8_0_431"
# Qwen3-32B B200 TensorRT-LLM disaggregated: 40 prefill + 6 decode workers as the file gives them.
DISAGG_40P6D = "nvidia_qwen3_32b_nvfp4_nvidia_qwen3_32b_nvfp4_b200_sxm_trtllm_disagg_15000x500_c480_tp_epnone_1"
AGG_70B = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x8192_c16_tp8_ep1_270"


def _row(rows: pd.DataFrame, row_id: str) -> pd.Series:
    pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")
    hit = rows[rows["id"] == row_id]
    assert len(hit) == 1, row_id
    return hit.iloc[0].copy()


def _cluster(pre: int, dec: int, clients: int, per_client: int = 10, warm_waves: int = 0) -> StudyConfig:
    cfg = StudyConfig()
    c = cfg.cluster
    c.num_replicas, c.num_prefill_replicas = pre + dec, pre
    c.replicas = [{"engine.tensor_parallel_size": 8}] * pre + [{"engine.tensor_parallel_size": 4}] * dec
    w = cfg.workload
    setattr(w, "concurrency", clients)
    setattr(w, "warmup_requests", warm_waves * clients)
    w.num_requests = (per_client - warm_waves) * clients
    return cfg


def test_the_development_row_is_simulated_as_half_its_cluster(rows: pd.DataFrame) -> None:
    cfg = row_study(_row(rows, DISAGG_2P2D), disagg="kv_fit_rate")
    assert (cfg.cluster.num_replicas, cfg.cluster.num_prefill_replicas, cfg.workload.concurrency) == (4, 2, 1024)
    out, part = slice_row(cfg, 1024, REPLICAS)
    c, w = out.cluster, out.workload
    assert part == Slice(2, 512, 1, 1) and part.label() == "1/2: P 1 D 1, 512 clients"
    assert (c.num_replicas, c.num_prefill_replicas, w.concurrency) == (2, 1, 512)
    assert c.replicas == [cfg.cluster.replicas[0], cfg.cluster.replicas[2]]  # one of each kind, in order
    assert w.num_requests == cfg.workload.num_requests // 2 and w.warmup_requests == cfg.workload.warmup_requests // 2
    assert out.scheduler == cfg.scheduler and out.engine == cfg.engine  # each worker's engine as the full row's
    assert cfg.workload.concurrency == 1024 and cfg.cluster.num_replicas == 4  # the row's own study untouched


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 400), st.integers(2, 10), st.integers(0, 1))
def test_a_slice_keeps_each_workers_clients_and_each_clients_requests(pre: int, dec: int, clients: int,
                                                                      per_client: int, warm: int) -> None:
    cfg = _cluster(pre, dec, clients, per_client, warm)
    out, part = slice_row(cfg, clients, REPLICAS)
    g = part.factor
    assert g == (math.gcd(math.gcd(pre, dec), clients) if pre + dec >= 3 else 1)
    if g == 1:
        assert out is cfg and part.label() == ""
        return
    c, w = out.cluster, out.workload
    assert c.num_prefill_replicas * g == pre and (c.num_replicas - c.num_prefill_replicas) * g == dec
    assert c.num_prefill_replicas >= 1 and c.num_replicas - c.num_prefill_replicas >= 1
    assert w.concurrency * g == clients
    # The same clients per worker of each kind, and the same requests per client.
    assert w.concurrency / c.num_prefill_replicas == clients / pre
    assert (w.num_requests + w.warmup_requests) / w.concurrency == per_client
    assert w.warmup_requests == warm * w.concurrency
    assert c.replicas == cfg.cluster.replicas[:pre // g] + cfg.cluster.replicas[pre:pre + dec // g]
    # No larger slice factor keeps whole workers and clients.
    assert all(pre % h or dec % h or clients % h for h in range(g + 1, min(pre, dec) + 1))


@pytest.mark.parametrize("pre,dec,clients", [(1, 4, 64), (2, 2, 129), (3, 2, 60), (2, 4, 3)])
def test_a_cluster_that_cannot_be_sliced_is_left_alone(pre: int, dec: int, clients: int) -> None:
    cfg = _cluster(pre, dec, clients)
    before = repr(cfg)
    out, part = slice_row(cfg, clients, REPLICAS)
    assert out is cfg and part.factor == 1 and repr(out) == before


def test_unlike_workers_of_one_kind_and_reduce_none_are_left_alone() -> None:
    cfg = _cluster(2, 2, 64)
    assert slice_row(cfg, 64, NONE) == (cfg, Slice())
    cfg.cluster.replicas = [{"engine.tensor_parallel_size": 8}, {"engine.tensor_parallel_size": 4}] * 2
    assert slice_factor(cfg, 64) == 1
    with pytest.raises(ValueError, match="allowed replicas, none"):
        slice_row(cfg, 64, "ranks")
    with pytest.raises(ValueError, match="does not divide clients"):
        reduce_study(_cluster(2, 2, 64), 61, 2)


def test_an_aggregated_row_is_one_engine_and_never_sliced(rows: pd.DataFrame) -> None:
    cfg = row_study(_row(rows, AGG_70B))
    assert slice_factor(cfg, 16) == 1


def test_simulate_row_runs_the_slice_and_says_so(rows: pd.DataFrame) -> None:
    row = _row(rows, DISAGG_40P6D)
    row["concurrency"], row["isl"], row["osl"] = 12, 512, 16  # the file's worker counts, few clients
    full = simulate_row((row.to_dict(), "roofline", {"reduce": NONE}))
    half = simulate_row((row.to_dict(), "roofline", {"reduce": REPLICAS}))
    default = simulate_row((row.to_dict(), "roofline"))
    assert full["reduction"] == "" and half["reduction"] == "1/2: P 20 D 3, 6 clients"
    timing = ("sim_wall_s", "sim_cpu_s")
    assert {k: v for k, v in default.items() if k not in timing} == {k: v for k, v in full.items()
                                                                     if k not in timing}
    assert half["measured_requests"] * 2 == full["measured_requests"] == 120  # 10 requests a client
    # The slice's per-request figures are the full cluster's up to the sampled lengths and routing.
    assert half["pred_tpot_ms"] == pytest.approx(full["pred_tpot_ms"], rel=0.10)
    assert half["pred_ttft_ms"] == pytest.approx(full["pred_ttft_ms"], rel=0.25)


def test_an_estimated_row_estimates_its_slice_wave_by_wave(rows: pd.DataFrame) -> None:
    from twinserve.sim.validate_estimate import ESTIMATE_WAVES, estimator_label

    row = _row(rows, DISAGG_40P6D)
    row["concurrency"], row["isl"], row["osl"] = 128, 512, 16  # 128 clients: estimated from waves
    full = simulate_row((row.to_dict(), "roofline", {"reduce": NONE}))
    half = simulate_row((row.to_dict(), "roofline", {"reduce": REPLICAS}))
    assert full["estimator"] == half["estimator"] == estimator_label(ESTIMATE_WAVES)
    assert half["reduction"] == "1/2: P 20 D 3, 64 clients"
    assert half["measured_requests"] * 2 == full["measured_requests"] == 10 * 128  # waves of the slice's clients
    assert half["pred_tpot_ms"] == pytest.approx(full["pred_tpot_ms"], rel=0.10)
    assert half["pred_ttft_ms"] == pytest.approx(full["pred_ttft_ms"], rel=0.25)
