"""`simulate validate`: rows -> studies (or reasons), the error summary, and the command's exits."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import twinserve.sim.validate_rows as vr
from twinserve.sim.cli import main
from twinserve.sim.validate import (expressible, finish_record, row_record, summarize_validation,
                                    throughput_per_gpu)
from twinserve.sim.validate_cli import FilterError, select_rows
from twinserve.sim.validate_rows import NotExpressible, request_counts, row_study

pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")


def _row(rows: pd.DataFrame, row_id: str) -> pd.Series:
    hit = rows[rows["id"] == row_id]
    assert len(hit) == 1, row_id
    return hit.iloc[0]


AGG_70B = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x8192_c16_tp8_ep1_270"
QWEN_NO_PRECISION = "qwen_qwen3_32b_qwen_qwen3_32b_gb200_trtllm_agg_2000x500_c1_tp2_epnone_2"
DISAGG_SGLANG = "2026_03_25_deepseek_r1_h100_sxm_sglang_fp8_disagg_1024x8192_c64_tp16_0_ep1_0_698"
DISAGG_QWEN = "nvidia_qwen3_32b_nvfp4_nvidia_qwen3_32b_nvfp4_b200_sxm_trtllm_disagg_15000x500_c480_tp_epnone_1"


def test_rows_come_from_the_package_with_concurrency_and_split(rows: pd.DataFrame) -> None:
    assert len(rows) == 5221
    assert set(rows["split"]) == {"dev", "heldout"}
    assert set(rows.loc[rows["split"] == "dev", "model"]) == set(vr.DEV_MODELS)
    # A disaggregated row's concurrency comes from its id (its batch_size is empty).
    assert _row(rows, DISAGG_QWEN)["concurrency"] == 480


ADP_DSR1 = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp4_agg_8192x1024_c256_tp8_ep8_969"  # batch_size 4, 64 ranks


def test_attention_dp_rows_run_their_benchmarks_clients_not_one_ranks_batch(rows: pd.DataFrame) -> None:
    # An attention-DP row's batch_size is one DP rank's batch: the id's client count is batch_size x
    # attention_dp_size in 168 of the 169 such rows (the other's id and batch_size agree: 32 clients).
    r = _row(rows, ADP_DSR1)
    assert (r["batch_size"], r["attention_dp_size"], r["concurrency"]) == (4, 64, 256)
    adp = rows[(rows["mode"] == "agg") & (rows["attention_dp_size"] > 1)]
    from_id = adp["id"].str.extract(r"_c(\d+)_")[0].astype(float)
    assert len(adp) > 100 and (adp["concurrency"] == from_id).all()
    one = rows[(rows["mode"] == "agg") & ~(rows["attention_dp_size"] > 1) & rows["batch_size"].notna()]
    assert (one["concurrency"] == one["batch_size"]).all()  # no attention DP: the row's batch as it is
    frame = pd.DataFrame({"id": ["m_agg_1024x1024_c96_x", "m_agg_1024x1024_c8_y", "m_disagg_1x1_c40_z"],
                          "batch_size": [12.0, 8.0, float("nan")], "attention_dp_size": [8.0, 1.0, 1.0],
                          "model_path": ["a/b"] * 3})
    assert vr.prepare_rows(frame)["concurrency"].tolist() == [96, 8, 40]


def test_agg_fp8_row_maps_to_its_concurrency_tp_and_fp8_weights_and_kv(rows: pd.DataFrame) -> None:
    cfg = row_study(_row(rows, AGG_70B), window="steady")  # the benchmark window: test_validate_protocol.py
    e, w = cfg.engine, cfg.workload
    assert (e.model, e.hardware, e.tensor_parallel_size) == ("Llama-3.1-70B", "H200", 8)
    assert (e.quantization, e.kv_cache_dtype) == ("fp8", "fp8")
    assert (w.prompt_mean, w.output_mean, w.prompt_dist, w.output_dist) == (1024, 8192, "fixed", "fixed")
    warm, _, total = request_counts(16)
    assert total == 16 + 16 + 16
    if vr.closed_loop_available():  # N clients, the first wave marked warm-up
        assert (getattr(w, "concurrency"), getattr(w, "warmup_requests")) == (16, warm)
        assert w.num_requests + warm == total
    else:
        assert w.num_requests == total
    assert cfg.scheduler.max_model_len >= 1024 + 8192
    assert cfg.scheduler.max_num_seqs >= 16
    assert cfg.cluster.num_replicas == 1


# DeepSeek-R1 FP8 at TP 4 on B200, TensorRT-LLM, 32 clients of 8192 + 1024 tokens (a development row).
DSR1_TP4_B200 = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_agg_8192x1024_c32_tp4_0_ep1_0_1183"


def test_a_trtllm_row_sizes_its_kv_pool_from_the_memory_left_after_the_weights(rows: pd.DataFrame) -> None:
    from twinserve.sim.build import DoesNotFit, build_cost_models, engine_capacity

    cfg = row_study(_row(rows, DSR1_TP4_B200))
    assert cfg.engine.kv_memory_basis == "free"
    assert row_study(_row(rows, AGG_70B)).engine.kv_memory_basis == "total"  # vLLM: a share of the GPU
    model, hw, _, _ = build_cost_models(cfg)
    ours = engine_capacity(cfg, model, hw)
    cfg.engine.kv_memory_basis = "total"
    try:
        theirs = engine_capacity(cfg, model, hw).num_blocks
    except DoesNotFit:
        theirs = 0
    # 157 GiB of weights on a 179 GiB GPU: the script's share (0.75 at 8k/1k TP 4: dsr1_fp8_b200_trt.sh
    # @0a919c5) of the rest holds the 32 clients' K/V; that share of the GPU would leave nothing or a few
    # GiB, and the clients would queue for blocks the measured run never waited on.
    assert cfg.engine.gpu_memory_utilization == 0.75
    per_seq = math.ceil((8192 + 1024) / cfg.scheduler.block_size)
    assert theirs < 32 * per_seq <= ours.num_blocks


def test_row_without_precision_is_the_16_bit_checkpoint(rows: pd.DataFrame) -> None:
    r = _row(rows, QWEN_NO_PRECISION)
    assert vr.precision_fields(r) == {"dtype": "bfloat16", "quantization": "none", "kv_cache_dtype": "auto"}


def test_disagg_row_maps_prefill_and_decode_workers_at_their_own_tp(rows: pd.DataFrame) -> None:
    r = _row(rows, DISAGG_QWEN).copy()
    r["precision"] = "fp8"  # its NVFP4 may not be expressible in this build; the layout is what is tested
    cfg = row_study(r)
    c = cfg.cluster
    assert (c.num_replicas, c.num_prefill_replicas) == (46, 40)
    tps = [rep["engine.tensor_parallel_size"] for rep in c.replicas]
    assert tps == [1] * 40 + [4] * 6
    assert vr.num_gpus(r) == 40 * 1 + 6 * 4
    assert vr.parallelism(r) == "P 40x tp1 | D 6x tp4"
    # The client's first token comes from the decode worker's stream (sim/disagg.py); an aggregated
    # row keeps the default (no decode replicas).
    assert c.disagg_first_token == "decode"
    assert row_study(_row(rows, AGG_70B)).cluster.disagg_first_token == "prefill"
    # A TensorRT-LLM disaggregated row's prefill starts at once; an SGLang one's once its decode worker has
    # pre-allocated the prompt's KV (sim/disagg.py).
    assert c.disagg_admission == "transfer"
    sgl = row_study(_row(rows, DISAGG_SGLANG)).cluster
    assert sgl.num_prefill_replicas > 0 and sgl.disagg_admission == "prealloc"
    assert sgl.disagg_reserved_decode_tokens == 512
    # ... and streams the transferred first token when its decode worker's loop takes it, before a step.
    assert sgl.disagg_first_token == "decode_admit"


def test_unexpressible_rows_give_a_reason(rows: pd.DataFrame) -> None:
    r = _row(rows, AGG_70B).copy()
    unknown = r.copy()
    unknown["model_path"], unknown["model"] = "acme/NoSuchModel-3B", "NoSuchModel-3B"
    assert "acme/NoSuchModel-3B" in expressible(unknown, "roofline")
    assert "nor the catalog" in expressible(unknown, "roofline")
    tpu = r.copy()
    tpu["system"] = "tpu_v5e"
    assert "tpu_v5e" in expressible(tpu, "roofline") and "h200_sxm" in expressible(tpu, "roofline")
    ep = r.copy()
    ep["moe_ep_size"] = 8  # a dense model: no experts to spread
    assert "expert parallelism" in expressible(ep, "roofline")
    none = r.copy()
    none["concurrency"] = float("nan")
    assert "concurrency" in expressible(none, "roofline")
    with pytest.raises(NotExpressible):
        row_study(unknown)
    # The CSV record of an unexpressible row: measured figures, no prediction, no error.
    rec = finish_record({**row_record(unknown), "expressible": False, "reason": "x"}, None)
    assert math.isnan(rec["err_tpot"]) and rec["meas_tpot_ms"] > 0


def test_throughput_per_gpu_is_the_closed_loop_cycle() -> None:
    # 16 clients, OSL 101: a request every 200 ms + 100 x 10 ms = 1.2 s; 16 x 101 / 1.2 / 8 GPUs.
    assert throughput_per_gpu(16, 1000, 101, 200.0, 10.0, 8) == pytest.approx(16 * 101 / 1.2 / 8)


def _frame() -> pd.DataFrame:
    base = {"backend": "vllm", "system": "h200_sxm", "model": "M", "split": "dev", "expressible": True}
    errs = [0.05, -0.15, 0.30, -0.08]
    recs = [{**base, "err_tpot": e, "err_ttft": 2 * e, "err_tput": -e} for e in errs]
    recs.append({**base, "split": "heldout", "model": "H", "err_tpot": 0.5, "err_ttft": 0.1, "err_tput": 0.0})
    recs.append({**base, "split": "heldout", "model": "H", "expressible": False,
                 "err_tpot": float("nan"), "err_ttft": float("nan"), "err_tput": float("nan")})
    return pd.DataFrame(recs)


def test_summary_statistics_by_hand() -> None:
    s = summarize_validation(_frame())
    dev = s["dev"]["groups"]["vllm | h200_sxm | M"]
    assert (dev["rows"], dev["expressible"], dev["simulated"]) == (4, 4, 4)
    t = dev["tpot"]
    # |errors| 0.05, 0.08, 0.15, 0.30: median (0.08 + 0.15) / 2; within 10%: 2 of 4; within 20%: 3 of 4.
    assert t["median_abs"] == pytest.approx(0.115)
    assert (t["within_10"], t["within_20"]) == (0.5, 0.75)
    # numpy's linear quantile: p90 at position 2.7 between 0.15 and 0.30.
    assert t["p90_abs"] == pytest.approx(0.15 + 0.7 * 0.15)
    assert dev["ttft"]["median_abs"] == pytest.approx(0.23)
    held = s["heldout"]["overall"]
    assert (held["rows"], held["expressible"], held["simulated"]) == (2, 1, 1)
    assert held["expressible_share"] == 0.5 and held["tpot"]["median_abs"] == 0.5
    assert s["all"]["overall"]["rows"] == 6


@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=40))
def test_summary_shares_and_quantiles_are_ordered(errs: list[float]) -> None:
    df = pd.DataFrame({"backend": "b", "system": "s", "model": "m", "split": "dev", "expressible": True,
                       "err_tpot": errs, "err_ttft": errs, "err_tput": errs})
    t = summarize_validation(df)["dev"]["overall"]["tpot"]
    assert 0 <= t["within_10"] <= t["within_20"] <= 1
    assert t["median_abs"] <= t["p90_abs"] + 1e-12 <= t["p99_abs"] + 2e-12
    assert t["n"] == len(errs)


@given(st.integers(1, 5000))
def test_request_counts_leave_a_full_wave_after_the_window(n: int) -> None:
    warm, measured, total = request_counts(n)
    assert warm == n and measured >= min(n, 16) and total == warm + measured + n


def test_select_rows_filters_and_names_what_exists(rows: pd.DataFrame) -> None:
    assert set(select_rows(rows, backend="VLLM")["backend"]) == {"vllm"}
    assert set(select_rows(rows, rows="heldout")["split"]) == {"heldout"}
    assert len(select_rows(rows, model="Llama-3.1-8B", limit=5)) == 5
    with pytest.raises(FilterError, match="sglang, trtllm, vllm"):
        select_rows(rows, backend="tgi")
    with pytest.raises(FilterError, match="h200_sxm"):
        select_rows(rows, system="a100")
    with pytest.raises(FilterError, match="Llama-3.1-70B"):
        select_rows(rows, model="Llama-4")


def test_cli_limit_3_writes_both_files(tmp_path, capsys) -> None:
    out = tmp_path / "v"
    rc = main(["validate", "--silicon", "--model", "Llama-3.1-8B", "--system", "h100_sxm",
               "--backend", "trtllm", "--limit", "3", "--out", str(out), "--workers", "1"])
    assert rc == 0
    df = pd.read_csv(out / "validation.csv")
    assert len(df) == 3 and df["expressible"].all()
    assert df["pred_tpot_ms"].gt(0).all() and df["err_tpot"].notna().all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout"]["overall"]["simulated"] == 3 and summary["dev"]["overall"]["rows"] == 0
    assert "| heldout | 3 |" in capsys.readouterr().out


@pytest.mark.parametrize("flags, says", [
    (["--backend", "tgi"], "known: sglang, trtllm, vllm"),
    (["--system", "a100"], "h100_sxm"),
    (["--model", "Llama-4"], "known:"),
    (["--limit", "0"], "--limit"),
    (["--cost-model", "magic"], "roofline"),
    (["--estimate-waves", "1"], "--estimate-waves 1: allowed 2 .. 9"),
])
def test_cli_bad_filters_exit_2(tmp_path, capsys, flags: list[str], says: str) -> None:
    assert main(["validate", "--silicon", *flags, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_cli_without_aiconfigurator_core_names_the_extra(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(vr, "AIC_PACKAGE", "aiconfigurator_core_not_installed")
    assert main(["validate", "--silicon", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "twinserve[aic]" in err and "aiconfigurator-core" in err


def test_rows_whose_layout_the_file_garbles_give_a_reason(rows: pd.DataFrame) -> None:
    tp72 = _row(rows, "2026_04_06_deepseek_r1_gb200_sglang_fp8_agg_8192x1024_c448_tp72_ep1_106")
    assert "tp 72 does not divide" in expressible(tp72, "roofline")
    from twinserve.sim.validate_inferencex import inferencex_workers
    no_counts = next(r for _, r in rows[(rows["mode"] == "disagg") & rows["prefill_num_workers"].isna()
                                        & rows["twin_id"].isna()].iterrows()
                     if inferencex_workers(r) is None)  # no matrix or recipe entry of its own either
    with pytest.raises(NotExpressible, match="worker counts"):  # unless a layout is assumed
        row_study(no_counts, disagg=None)
    odd = _row(rows, AGG_70B).copy()
    odd["model_path"], odd["model"] = "deepseek-ai/DeepSeek-R1", "DeepSeek-R1"
    odd["moe_tp_size"] = 2  # tp 8 x adp 1 = 8 GPUs, but 2 x 1 for the experts
    assert "inconsistent layout" in expressible(odd, "roofline")


def test_a_model_config_the_simulator_cannot_read_is_a_reason_without_machine_paths(rows: pd.DataFrame,
                                                                                     monkeypatch) -> None:
    import twinserve.backends.sim.aic_models as am
    from twinserve.backends.sim.hf_config import ModelConfigError

    def unreadable(path: str):
        raise ModelConfigError("layer_types", "layer type(s) mamba are not modelled by the simulator",
                               "/x/lib/python3.11/site-packages/aiconfigurator_core/model_configs/m.json", 7)
    monkeypatch.setattr(am, "resolve_row_model", unreadable)
    reason = expressible(_row(rows, AGG_70B), "roofline")
    assert "not modelled" in reason and "site-packages" not in reason


def test_linear_attention_rows_run_on_the_roofline_and_aic_gives_a_reason(rows: pd.DataFrame) -> None:
    qwen35 = rows[rows["model_path"] == "Qwen/Qwen3.5-397B-A17B"].iloc[0]
    assert expressible(qwen35, "roofline") == ""
    reason = expressible(qwen35, "aic")
    assert "Gated DeltaNet" in reason and "site-packages" not in reason


def test_a_row_priced_by_another_aic_version_says_so(rows: pd.DataFrame, tmp_path, capsys) -> None:
    from twinserve.backends.sim.aic.mapping import resolve_version

    current = resolve_version("b200_sxm", "vllm", "")
    own = rows[(rows["system"] == "b200_sxm") & (rows["backend"] == "vllm")
               & (rows["backend_version"] == "0.19.0")].iloc[0]
    assert vr.aic_version_used(own.to_dict()) == f"{current} (the row's 0.19.0 is not installed; aic's current)"
    assert vr.aic_version_used({**own.to_dict(), "backend_version": float("nan")}).endswith(
        "(the row gives no vllm version; aic's current)")
    assert vr.aic_version_used({**own.to_dict(), "backend_version": current}) == current
    out = tmp_path / "v"
    assert main(["validate", "--silicon", "--cost-model", "aic", "--model", "Llama-3.1-70B", "--system", "b200_sxm",
                 "--backend", "vllm", "--window", "steady", "--max-clients", "16", "--limit", "1",
                 "--workers", "1", "--out", str(out)]) == 0
    df = pd.read_csv(out / "validation.csv")
    assert df["aic_version"].str.contains("aic's current").all(), df["aic_version"]
    assert "1 rows priced by aic's current database" in capsys.readouterr().out


def test_rows_matched_but_none_expressible_exit_3_naming_the_reasons(tmp_path, capsys) -> None:
    # Both vLLM H100 rows of Qwen3-235B-A22B lack a client concurrency: nothing can be judged, so the
    # command must not end as a success (a study would run on with an empty judge), yet the reasons
    # are written (validation.csv keeps every row and its reason).
    out = tmp_path / "v"
    rc = main(["validate", "--silicon", "--backend", "vllm", "--model", "Qwen3-235B-A22B", "--system", "h100_sxm",
               "--out", str(out), "--workers", "1"])
    cap = capsys.readouterr()
    assert rc == 3
    assert "none of the 2 rows is expressible" in cap.err and "no client concurrency" in cap.err
    assert "Traceback" not in cap.err
    df = pd.read_csv(out / "validation.csv")
    assert len(df) == 2 and not df["expressible"].any() and df["reason"].str.contains("concurrency").all()


@pytest.mark.parametrize("flags, says", [
    (["--model", "Llama-3.1-8B", "--rows", "dev"], "--rows dev: none of the"),
    (["--model", "Llama-3.1-70B", "--rows", "heldout"], "--rows heldout: none of the"),
])
def test_a_filter_that_leaves_no_row_exits_2_naming_that_filter(tmp_path, capsys, flags: list[str],
                                                                 says: str) -> None:
    assert main(["validate", "--silicon", *flags, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
