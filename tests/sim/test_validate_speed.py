"""`simulate validate` stops each run once its measured window is final: the window's figures
must equal a full run's (sim.clients.FirstRequestsDone, sim.validate.run_to_window)."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.validate import run_to_window, window_means

from .helpers import small_config

COLUMNS = ["request_id", "arrival_s", "queue_s", "ttft_s", "tpot_s", "e2e_s", "finish_s", "output_tokens",
           "replica", "client", "warmup"]


def _first(req: pd.DataFrame, count: int) -> pd.DataFrame:
    return req.sort_values(["arrival_s", "request_id"], kind="stable").iloc[:count][COLUMNS].reset_index(drop=True)


@settings(max_examples=30)
@given(n=st.integers(1, 8), extra=st.integers(0, 12), count=st.integers(1, 20),
       think=st.sampled_from([0.0, 0.0, 0.03]), replicas=st.sampled_from([1, 1, 2]), disagg=st.booleans(),
       ff=st.booleans(), fixed=st.booleans(), seed=st.integers(0, 3), turns=st.sampled_from([1, 1, 2]))
def test_a_run_stopped_at_its_window_gives_the_windows_requests_exactly(n, extra, count, think, replicas, disagg,
                                                                        ff, fixed, seed, turns) -> None:
    lengths = (dict(prompt_dist="fixed", prompt_mean=96, prompt_min=96, prompt_max=96, output_dist="fixed",
                    output_mean=12, output_min=12, output_max=12) if fixed else
               dict(prompt_dist="uniform", prompt_min=16, prompt_max=300, output_dist="uniform", output_min=2,
                    output_max=30))
    cfg = small_config(concurrency=n, num_requests=count + extra, warmup_requests=0, think_time_s=think,
                       num_replicas=replicas, num_prefill_replicas=1 if disagg and replicas > 1 else 0,
                       fast_forward=ff, seed=seed, turns=turns, followup_tokens=8, max_model_len=1024,
                       max_num_batched_tokens=256, **lengths)
    full = run_to_window(cfg, count, stop_early=False)
    early = run_to_window(cfg, count, stop_early=True)
    assert len(early) <= len(full)
    pd.testing.assert_frame_equal(_first(early, count), _first(full, count))
    warm = min(n, count - 1)
    assert window_means(early, warm, count - warm) == window_means(full, warm, count - warm)


def test_the_stop_leaves_the_last_wave_unsimulated() -> None:
    # 4 clients, fixed lengths: the window (the first 8 sent) ends a whole wave before the last 4 finish.
    cfg = small_config(concurrency=4, num_requests=12, warmup_requests=0, prompt_dist="fixed", prompt_mean=64,
                       prompt_min=64, prompt_max=64, output_dist="fixed", output_mean=20, output_min=20,
                       output_max=20)
    full = run_to_window(cfg, 8, stop_early=False)
    early = run_to_window(cfg, 8, stop_early=True)
    assert len(full) == 12 and len(early) == 8
    assert early["finish_s"].max() < full["finish_s"].max()


def test_a_finished_run_is_read_and_freed_under_the_runs_collector_settings(monkeypatch) -> None:
    # Restored at the run's end, the collector's first full collection would walk the finished run's world
    # (seconds at thousands of clients) while its requests frame is built, and then the world is freed anyway.
    import gc

    import twinserve.sim.metrics as metrics

    outside = gc.get_threshold()
    during: list[tuple[int, int, int]] = []
    frame = metrics.requests_frame

    def spy(*args, **kwargs):
        during.append(gc.get_threshold())
        return frame(*args, **kwargs)

    monkeypatch.setattr(metrics, "requests_frame", spy)
    req = run_to_window(small_config(concurrency=3, num_requests=9, warmup_requests=0), 9, stop_early=False)
    assert len(req) == 9
    assert len(during) == 1 and during[0] != outside
    assert gc.get_threshold() == outside


# Two campaigns' records of one launch (the same image, v0.19.0). The B300 FP8 pair this test used before differ now:
# the v0.19.0 image's launch carries its script's step budget, the nightly image's does not (validate_recipes.py).
SAME_A = "minimaxm2_5_b200_vllm_fp8_agg_1024x1024_c4_cfg634"
SAME_B = "2026_03_25_minimax_m2_5_b200_sxm_vllm_fp8_agg_1024x1024_c4_tp4_0_ep1_0_75"  # another campaign's
OTHER = "minimaxm2_5_b200_vllm_fp8_agg_1024x1024_c8_cfg634"


def test_rows_with_one_study_run_once_and_the_longest_rows_start_first(monkeypatch) -> None:
    import pytest

    pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")
    import twinserve.sim.validate_cli as vc
    from twinserve.sim.validate_rows import load_rows

    rows = load_rows().set_index("id", drop=False).loc[[SAME_A, OTHER, SAME_B]]
    started: list[str] = []
    real = vc.run_jobs

    def spy(fn, jobs, points, *a, **kw):
        started.extend(j[0]["id"] for j in jobs)
        return real(fn, jobs, points, *a, **kw)

    monkeypatch.setattr(vc, "run_jobs", spy)
    out = vc.run_validation(rows, "roofline", 1, None, progress=False).set_index("row_id")
    assert started == [OTHER, SAME_A]  # 8 clients before 4; SAME_B is SAME_A's study
    assert out.loc[SAME_B, "same_study_as"] == SAME_A and out.loc[OTHER, "same_study_as"] == ""
    for col in ("pred_ttft_ms", "pred_tpot_ms", "pred_ttft_all_ms"):
        assert out.loc[SAME_B, col] == out.loc[SAME_A, col]
    # Each row keeps its own measurement, so its own errors.
    assert out.loc[SAME_B, "meas_tpot_ms"] != out.loc[SAME_A, "meas_tpot_ms"]
    assert vc.cost_estimate(rows.loc[OTHER].to_dict()) > vc.cost_estimate(rows.loc[SAME_A].to_dict())


def _run(cfg, keep_token_times: bool):
    from twinserve.sim.build import build
    from twinserve.sim.cluster_study import build_cluster
    from twinserve.sim.metrics import requests_frame
    from twinserve.sim.study import is_cluster

    cluster = is_cluster(cfg)
    sim = build_cluster(cfg, keep_steps=False).simulation if cluster else build(cfg).simulation
    sim.keep_token_times = keep_token_times
    res = sim.run()
    records = (res.total if cluster else res).records
    return requests_frame(res.total if cluster else res, itl=False), records


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 8), count=st.integers(1, 20), replicas=st.sampled_from([1, 2, 3]), disagg=st.booleans(),
       ff=st.booleans(), seed=st.integers(0, 3), turns=st.sampled_from([1, 1, 2]), caching=st.booleans())
def test_a_run_without_token_times_gives_the_same_requests(n, count, replicas, disagg, ff, seed, turns,
                                                          caching) -> None:
    # validate's runs skip per-token times (Simulation/ClusterSimulation.keep_token_times = False):
    # every other figure of every request must be a run's with them, and the records hold none.
    cfg = small_config(concurrency=n, num_requests=count, warmup_requests=0, num_replicas=replicas,
                       num_prefill_replicas=1 if disagg and replicas > 1 else 0, fast_forward=ff, seed=seed,
                       turns=turns, followup_tokens=8, max_model_len=1024, max_num_batched_tokens=256,
                       enable_prefix_caching=caching, prompt_dist="uniform", prompt_min=16, prompt_max=300,
                       output_dist="uniform", output_min=2, output_max=60)
    with_times, records = _run(cfg, True)
    without, bare = _run(cfg, False)
    pd.testing.assert_frame_equal(without, with_times)
    assert all(r.token_times == [] for r in bare)
    assert any(len(r.token_times) > 1 for r in records)  # the run decoded: times were there to skip
