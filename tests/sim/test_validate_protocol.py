"""`simulate validate --window`: each row's closed loop sends and counts what its benchmark did."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.validate import simulate_row, window_means
from twinserve.sim.validate_engines import FRONTEND_LATENCY_S, frontend_latency_s
from twinserve.sim.validate_cli import FilterError, within_clients
from twinserve.sim.validate_protocol import (AIC_GAP, BENCHMARK, GAP_BENCHMARK, INFERENCEX, INFERENCEX_GAP_FILES,
                                             STEADY, WINDOWS, harness, run_design)
from twinserve.sim.validate_rows import design_counts, load_rows, request_counts, row_study

pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")

AGG_70B = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x8192_c16_tp8_ep1_270"
QWEN_GAP = "qwen_qwen3_32b_qwen_qwen3_32b_gb200_trtllm_agg_2000x500_c1_tp2_epnone_2"


def _row(rows: pd.DataFrame, row_id: str) -> pd.Series:
    hit = rows[rows["id"] == row_id]
    assert len(hit) == 1, row_id
    return hit.iloc[0]


def test_harness_is_read_from_the_rows_source(rows: pd.DataFrame) -> None:
    assert harness(_row(rows, AGG_70B)) == INFERENCEX  # source_file=2026-04-06.csv (InferenceX's DB export)
    assert harness(_row(rows, QWEN_GAP)) == AIC_GAP
    dump = rows[rows["silicon_data_source"].str.startswith("db-dump/")].iloc[0]
    assert harness(dump) == INFERENCEX
    # Every development row but Qwen3-32B's is an InferenceX run.
    dev = rows[rows["split"] == "dev"]
    gap_models = set(dev[dev.apply(harness, axis=1) == AIC_GAP]["model"])
    assert gap_models <= {"Qwen3-32B", "gpt-oss-120b", "DeepSeek-R1"}


def test_benchmark_window_is_inferencex_benchmark_serving(rows: pd.DataFrame) -> None:
    # benchmark_serving.py --num-prompts $((CONC * 10)) --random-range-ratio 0.8: randint(int(0.8 L), L + 1).
    assert (BENCHMARK.requests_per_client, BENCHMARK.warmup_waves, BENCHMARK.length_low) == (10, 0, 0.8)
    assert BENCHMARK.lengths(1024) == (819, 1024) and BENCHMARK.lengths(8192) == (6553, 8192)
    cfg = row_study(_row(rows, AGG_70B), window="benchmark")
    w = cfg.workload
    assert (w.prompt_dist, w.prompt_min, w.prompt_max) == ("uniform", 819, 1024)
    assert (w.output_dist, w.output_min, w.output_max) == ("uniform", 6553, 8192)
    assert (w.concurrency, w.warmup_requests, w.num_requests) == (16, 0, 160)
    steady = row_study(_row(rows, AGG_70B), window="steady").workload
    assert (steady.prompt_dist, steady.prompt_min, steady.output_max) == ("fixed", 1024, 8192)
    assert steady.warmup_requests == 16 and steady.num_requests + 16 == request_counts(16)[2]
    with pytest.raises(ValueError, match="benchmark, benchmark-full, steady"):
        run_design(_row(rows, AGG_70B), "median")
    assert WINDOWS == ("benchmark", "benchmark-full", "steady")
    assert run_design(_row(rows, AGG_70B), "benchmark-full") is BENCHMARK


def test_gap_analysis_rows_run_the_same_counts_at_exact_lengths(rows: pd.DataFrame) -> None:
    # Chosen on the development rows (sim/validate_protocol.py): exact ISL/OSL, 10 N requests, all counted.
    gap = _row(rows, QWEN_GAP)
    for window in ("benchmark", "benchmark-full"):
        assert run_design(gap, window) is GAP_BENCHMARK
    assert run_design(gap, "steady") is STEADY
    w = row_study(gap, window="benchmark").workload
    assert (w.prompt_dist, w.prompt_max, w.output_dist, w.output_max) == ("fixed", 2000, "fixed", 500)
    assert (w.concurrency, w.warmup_requests, w.num_requests) == (1, 0, 10)


@given(st.integers(1, 100_000), st.sampled_from([BENCHMARK, STEADY]))
def test_design_counts_add_up(n: int, design) -> None:
    warm, measured, total = design_counts(n, design)
    assert warm + measured <= total and measured >= 1 and warm >= 0
    if design is BENCHMARK:  # every request sent is counted
        assert (warm, measured, total) == (0, 10 * n, 10 * n)
    else:
        assert (warm, measured, total) == request_counts(n)


def _small(rows: pd.DataFrame, n: int, isl: int, osl: int) -> pd.Series:
    r = _row(rows, AGG_70B).copy()
    r["concurrency"], r["batch_size"], r["isl"], r["osl"] = n, n, isl, osl
    return r


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 6), st.integers(20, 300), st.integers(2, 24))
def test_benchmark_run_sends_10n_counts_all_and_keeps_n_in_flight(n: int, isl: int, osl: int) -> None:
    rows = _ROWS()
    row = _small(rows, n, isl, osl)
    from twinserve.sim.study import run_point
    req = run_point(row_study(row, window="benchmark")).requests
    assert len(req) == 10 * n and not req["warmup"].any()
    lo_p, hi_p = BENCHMARK.lengths(isl)
    assert req["prompt_tokens"].between(lo_p, hi_p).all()
    # Closed loop: at no moment more than N requests between send and last token.
    events = sorted([(t, 1) for t in req["arrival_s"]] + [(t, -1) for t in req["finish_s"]],
                    key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak <= n
    # Each client's requests run one after another.
    for _, g in req.sort_values("arrival_s").groupby("client"):
        assert (g["arrival_s"].to_numpy()[1:] >= g["finish_s"].to_numpy()[:-1] - 1e-9).all()
    # The prediction is the mean over every request, the first (cold) wave included.
    pred = simulate_row((row.to_dict(), "roofline", {"window": "benchmark"}))
    assert pred["pred_ttft_engine_ms"] == pytest.approx(req["ttft_s"].mean() * 1000)
    # ... plus the front end's latency outside the engine (vLLM's, fitted on development rows): its
    # constant and its rate per prompt token (validate_engines.FRONTEND_S_PER_PROMPT_TOKEN).
    front_ms = pred["pred_ttft_ms"] - pred["pred_ttft_engine_ms"]
    assert front_ms == pytest.approx(1000 * frontend_latency_s("vllm", isl))
    assert front_ms > 1000 * FRONTEND_LATENCY_S["vllm"] > 0
    assert pred["measured_requests"] == 10 * n and pred["window"] == "benchmark"
    assert window_means(req, 0, len(req))["tpot_ms"] == pytest.approx(pred["pred_tpot_ms"])


_CACHE: dict[str, pd.DataFrame] = {}


def _ROWS() -> pd.DataFrame:  # noqa: N802 - hypothesis tests cannot take a module fixture
    if "rows" not in _CACHE:
        _CACHE["rows"] = load_rows()
    return _CACHE["rows"]


def test_max_clients_keeps_the_smaller_rows_and_names_the_least(rows: pd.DataFrame) -> None:
    kept = within_clients(rows, 2000)
    assert kept["concurrency"].max() <= 2000 and len(kept) < len(rows)
    assert (rows["concurrency"] > 2000).sum() + len(kept) == len(rows)
    assert within_clients(rows, None) is rows
    big = rows[rows["concurrency"] > 4]
    with pytest.raises(FilterError, match=f"least: {int(big['concurrency'].min())}"):
        within_clients(big, 1)
    with pytest.raises(FilterError, match="must be >= 1"):
        within_clients(rows, 0)


# kimi-k2.5-gap-analysis.csv (held out: only its rows' configuration and measured columns are read here).
_KIMI_GAP = "kimi-k2.5-gap-analysis.csv"
_TWIN_KEY = ["backend", "system", "precision", "isl", "osl", "concurrency"]


def _kimi_gap_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["silicon_data_source"].str.startswith(f"source_file={_KIMI_GAP}")]


def _inferencex_record(rows: pd.DataFrame, gap: pd.Series) -> pd.Series:
    """The InferenceX dump record whose measured TTFT and TPOT, printed to 0.01 ms, are the gap row's."""
    ix = rows[rows["silicon_data_source"].str.startswith(("source_file=2026-", "db-dump/"))]
    same = ix[(ix[_TWIN_KEY] == gap[_TWIN_KEY]).all(axis=1)
              & ((ix["silicon_ttft_ms"] - gap["silicon_ttft_ms"]).abs() <= 0.005 + 1e-9)
              & ((ix["silicon_tpot_ms"] - gap["silicon_tpot_ms"]).abs() <= 0.005 + 1e-9)]
    assert len(same) >= 1, gap["id"]
    return same.iloc[0]


def test_every_kimi_gap_analysis_row_is_an_inferencex_run_reprinted(rows: pd.DataFrame) -> None:
    # The fact INFERENCEX_GAP_FILES rests on: each row's measured figures are an InferenceX record's, rounded.
    gap = _kimi_gap_rows(rows)
    assert len(gap) == 47 and set(gap["backend"]) == {"vllm"} and set(gap["mode"]) == {"agg"}
    for _, g in gap.iterrows():
        twin = _inferencex_record(rows, g)
        assert harness(twin) == INFERENCEX
        assert str(g["backend_version"]) == str(twin["backend_version"])
    assert _KIMI_GAP in INFERENCEX_GAP_FILES


def test_a_kimi_gap_row_runs_its_inferencex_twins_study(rows: pd.DataFrame) -> None:
    # InferenceX's benchmark (lengths on [0.8 L, L]) and launch script, as the record it reprints: memory 0.97 on
    # B200 INT4, and the FP4 "tp4 ep4" rows as the one TP 4 group the script launched (config 635's run).
    from twinserve.sim.validate_recipes import row_recipe
    from twinserve.sim.validate_rows import row_plan
    gap = _kimi_gap_rows(rows)
    picks = [gap[(gap["precision"] == "int4") & (gap["system"] == "b200_sxm")].iloc[0],
             gap[(gap["precision"] == "int4") & (gap["system"] == "h200_sxm")].iloc[0],
             gap[(gap["precision"] == "fp4") & (gap["moe_ep_size"] == 4)].iloc[0]]
    for g in picks:
        twin = _inferencex_record(rows, g)
        assert harness(g) == INFERENCEX and run_design(g) is BENCHMARK
        assert row_recipe(g) == row_recipe(twin) and "kimik2.5_" in row_recipe(g).source
        a, b = row_plan(g, "aic"), row_plan(twin, "aic")
        a.cfg.run.name = b.cfg.run.name
        assert a.cfg == b.cfg and a.layout == b.layout
        w = a.cfg.workload
        assert (w.prompt_dist, w.prompt_min) == ("uniform", int(0.8 * int(g["isl"])))
    int4_b200, int4_h200, fp4 = (row_plan(g, "aic").cfg.engine for g in picks)
    assert (int4_b200.gpu_memory_utilization, int4_h200.gpu_memory_utilization) == (0.97, 0.95)
    assert (fp4.tensor_parallel_size, fp4.expert_parallel_size, fp4.data_parallel_size) == (4, 1, 1)
