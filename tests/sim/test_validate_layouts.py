"""Rows that leave part of their layout out: assumed worker counts, inferred attention DP, flagged apart."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.sim.validate import expressible, finish_record, row_record, summarize_validation
from twinserve.sim.validate_inferencex import assumed_entry, candidates
from twinserve.sim.validate_layouts import DISAGG_ASSUMPTIONS, ENTRY, PREFILL_BUSY, decode_slots
from twinserve.sim.validate_rows import NotExpressible, row_plan

pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")

# InferenceMAX dumps: prefill TP 8 / EP 8 and decode TP 8 / EP 8 given, worker counts not.
# (Rows without a twin record of the same run, sim/validate_twins.py: those take the twin's counts.)
DISAGG_NO_COUNTS = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c1024_tp8_0_ep8_0_431"  # H200 1k/1k at 1,024: two srt-slurm recipes with other workers
DISAGG_LOW_C = "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c13_tp8_ep8_1829"
AGG_70B = "2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x8192_c16_tp8_ep1_270"
# vLLM row with tp 1, moe_tp 2, moe_ep 1 and no attention_dp_size: two DP ranks.
NO_ADP = "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_1000x100_c8_tp1_epnone_2"


def _row(rows: pd.DataFrame, row_id: str) -> pd.Series:
    hit = rows[rows["id"] == row_id]
    assert len(hit) == 1, row_id
    return hit.iloc[0]


def test_disagg_row_without_counts_takes_its_layouts_from_the_columns(rows) -> None:
    row = _row(rows, DISAGG_NO_COUNTS)
    assert math.isnan(row["prefill_num_workers"]) and math.isnan(row["decode_num_workers"])
    plan = row_plan(row, disagg="kv_fit_rate")
    p, d = plan.counts
    c = plan.cfg.cluster
    assert (c.num_prefill_replicas, c.num_replicas) == (p, p + d)
    layout = {"engine.tensor_parallel_size": int(row["decode_tp_size"]),
              "engine.expert_parallel_size": int(row["decode_moe_ep_size"])}
    # Prefill and decode both TP 8 x EP 8 in this row; a TensorRT-LLM ctx worker runs without the overlap scheduler.
    overlap = {"scheduler.overlap_scheduler": False} if row["backend"] == "trtllm" else {}
    assert c.replicas[0] == {**layout, **overlap} and c.replicas[-1] == layout
    assert plan.layout == f"assumed kv_fit_rate: {p} prefill, {d} decode workers"
    rec = row_record(row, disagg="kv_fit_rate")
    assert rec["layout"] == plan.layout and rec["gpus"] == 8 * (p + d)
    assert rec["parallelism"].startswith(f"P {p}x tp8 ep8 | D {d}x")


def test_kv_fit_decode_workers_are_the_fewest_holding_every_client(rows) -> None:
    row = _row(rows, DISAGG_NO_COUNTS)
    plan = row_plan(row, disagg="kv_fit")
    slots = decode_slots(plan.cfg, int(row["isl"]), int(row["osl"]))
    p, d = plan.counts
    n = int(row["concurrency"])
    assert p == 1 and d * slots >= n > (d - 1) * slots and d > 1



def test_kv_fit_counts_at_exact_multiples(rows, monkeypatch) -> None:
    import twinserve.sim.validate_layouts as vl
    monkeypatch.setattr(vl, "decode_slots", lambda cfg, isl, osl: 100)  # a pool of exactly 100 clients
    row = _row(rows, DISAGG_NO_COUNTS).copy()
    for clients, decode in ((1, 1), (100, 1), (101, 2), (200, 2), (300, 3)):
        row["concurrency"] = clients
        assert row_plan(row, disagg="kv_fit").counts == (1, decode)


@settings(max_examples=25, deadline=None)
@given(clients=st.integers(1, 6000), how=st.sampled_from(DISAGG_ASSUMPTIONS))
def test_assumed_counts_hold_every_client_and_prefill_keeps_up(rows, clients: int, how: str) -> None:
    from hypothesis import assume
    row = _row(rows, DISAGG_NO_COUNTS).copy()
    row["concurrency"] = clients
    assume(not candidates(row))  # the assumption is for counts no InferenceX entry gives (H200 8k/1k 28, 64 do)
    plan = row_plan(row, disagg=how)
    p, d = plan.counts
    assert p >= 1 and d >= 1
    if how == ENTRY:
        # The nearest entries of the row's shape (this configuration has them at every client count): the pick's
        # workers, flagged; the count assumptions below are for rows without any.
        pick = assumed_entry(row)
        assert pick is not None and (p, d) == (pick.prefill.count, pick.decode.count)
        assert plan.layout.startswith("assumed entry (none at")
        return
    if how == "one_each":
        assert (p, d) == (1, 1)
        return
    slots = decode_slots(plan.cfg, int(row["isl"]), int(row["osl"]))
    assert d * slots >= clients > (d - 1) * slots  # the fewest decode workers whose KV holds them all
    if how == "kv_fit_rate":
        from twinserve.sim.validate_layouts import _roofline, _with_layout
        pre = _with_layout(plan.cfg, plan.cfg.cluster.replicas[0])
        isl, osl = int(row["isl"]), int(row["osl"])
        t_pre = _roofline(pre).step_time(isl, 1, 0, isl * (isl + 1) / 2, 0, 0)
        per = math.ceil(clients / d)
        t_dec = _roofline(plan.cfg).step_time(0, 0, 0, 0.0, per, per * (isl + osl // 2))
        busy = clients / (osl * t_dec) * t_pre / p
        assert busy <= PREFILL_BUSY + 1e-9  # prefill keeps up with the decode side
        assert p == 1 or busy * p / (p - 1) > PREFILL_BUSY  # ... with the fewest workers


def test_low_concurrency_row_is_one_prefill_one_decode_under_every_count_assumption(rows) -> None:
    row = _row(rows, DISAGG_LOW_C)
    assert {row_plan(row, disagg=h).counts for h in DISAGG_ASSUMPTIONS if h != ENTRY} == {(1, 1)}


def test_without_an_assumption_the_row_keeps_its_reason(rows) -> None:
    row = _row(rows, DISAGG_NO_COUNTS)
    assert "worker counts" in expressible(row, "roofline", disagg=None)
    with pytest.raises(NotExpressible, match="worker counts"):
        row_plan(row, disagg=None)
    with pytest.raises(ValueError, match="one of entry, kv_fit_rate"):
        row_plan(row, disagg="two_each")


def test_rows_giving_counts_are_not_flagged(rows) -> None:
    given_counts = rows[(rows["mode"] == "disagg") & rows["prefill_num_workers"].notna()].iloc[0]
    plan = row_plan(given_counts)
    assert plan.layout == "" and plan.counts is None
    assert row_plan(_row(rows, AGG_70B)).layout == ""


def test_missing_attention_dp_is_inferred_from_moe_tp_times_ep(rows) -> None:
    row = _row(rows, NO_ADP)
    assert math.isnan(row["attention_dp_size"]) and (row["tp_size"], row["moe_tp_size"]) == (1, 2)
    plan = row_plan(row)
    e = plan.cfg.engine
    assert (e.tensor_parallel_size, e.data_parallel_size) == (1, 2)
    assert plan.layout.startswith("inferred attention_dp 2")
    assert row_record(row)["gpus"] == 2


def test_summary_counts_as_given_and_assumed_apart(rows) -> None:
    recs = []
    for rid in (AGG_70B, DISAGG_NO_COUNTS, NO_ADP):
        row = _row(rows, rid)
        rec = row_record(row)
        rec["expressible"], rec["reason"] = True, ""
        recs.append(finish_record(rec, {"pred_ttft_ms": rec["meas_ttft_ms"], "pred_tpot_ms": rec["meas_tpot_ms"] * 1.5}))
    s = summarize_validation(pd.DataFrame(recs))
    o = s["all"]["overall"]
    assert (o["expressible"], o["expressible_as_given"], o["expressible_assumed"]) == (3, 1, 2)
    assert s["all"]["as_given"]["rows"] == 1 and s["all"]["assumed_layout"]["rows"] == 2
    assert s["all"]["assumed_layout"]["tpot"]["median_abs"] == pytest.approx(0.5)


def test_gpu_count_tp_rows_keep_a_reason_naming_the_layout(rows) -> None:
    tp36 = rows[rows["id"].str.contains("deepseek_r1_gb200_trtllm_fp4_agg_1024x1024_c32_tp36")].iloc[0]
    reason = expressible(tp36, "roofline")
    assert "tp 36" in reason and "128 attention heads" in reason and "256 experts" in reason


def test_layout_filter_keeps_the_assumed_or_the_given_rows(rows) -> None:
    from twinserve.sim.validate_cli import select_rows
    qwen = rows[rows["model"] == "Qwen3-235B-A22B"]
    assumed = select_rows(qwen, layout="assumed")
    given = select_rows(qwen, layout="given")
    assert len(assumed) == 19 and len(assumed) + len(given) == len(qwen)
    assert all(row_record(r)["layout"].startswith("inferred attention_dp") for _, r in assumed.iterrows())


def test_a_decode_worker_that_cannot_hold_the_model_is_a_reason(rows) -> None:
    from twinserve.sim.validate_inferencex import inferencex_workers
    # (a row whose twin record or InferenceX entry gives its workers runs those instead)
    tp1 = next(r for _, r in rows[rows["id"].str.startswith("2026_04_06_deepseek_r1_gb200_sglang_fp8_disagg_8192x1024_")
                                  & (rows["decode_tp_size"] == 1) & rows["twin_id"].isna()].iterrows()
               if inferencex_workers(r) is None)
    reason = expressible(tp1, "roofline")
    assert "decode worker (tensor_parallel_size=1) does not hold the model" in reason and "GiB" in reason


def test_run_validation_carries_the_assumption_to_the_simulated_row(rows) -> None:
    from twinserve.sim.validate_cli import run_validation
    one = rows[rows["id"] == DISAGG_LOW_C]
    out = run_validation(one, "roofline", None, None, progress=False, disagg="one_each").iloc[0]
    assert out["layout"] == "assumed one_each: 1 prefill, 1 decode workers" and out["gpus"] == 16
    assert out["pred_tpot_ms"] > 0 and not out["sim_error"]
    none = run_validation(one, "roofline", None, None, progress=False, disagg=None).iloc[0]
    assert not none["expressible"] and "worker counts" in none["reason"]


# InferenceX dumps write `tp 8, ep 8` on one 8-GPU node as tp_size 64 = moe_tp 8 x moe_ep 8 (the id keeps tp8_ep8).
TP_TIMES_EP = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp8_agg_8192x1024_c4_tp8_ep8_920"
# gpt-oss-120b TensorRT-LLM on H100 at tp 4, moe_tp 2 x moe_ep 2: four GPUs, within a node, as given.
TP4_MTP2_EP2 = "openai_gpt_oss_120b_openai_gpt_oss_120b_h100_sxm_trtllm_agg_4000x1000_c320_tp4_epnone_4"
# tp 1 x attention_dp 64 = moe_tp 8 x moe_ep 8, 64 clients (batch_size 1 a rank): one node's attention DP 8 x EP 8.
ADP64 = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp4_agg_1024x1024_c64_tp8_ep8_937"


def test_tp_size_that_is_moe_tp_times_ep_past_a_node_is_one_nodes_server(rows) -> None:
    row = _row(rows, TP_TIMES_EP)
    assert (row["tp_size"], row["moe_tp_size"], row["moe_ep_size"]) == (64, 8, 8)
    plan = row_plan(row)
    e = plan.cfg.engine
    assert (e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size) == (8, 1, 8)
    assert plan.layout.startswith("inferred tp8 ep8") and "64 GPUs" in plan.layout
    assert row_record(row)["gpus"] == 8 and row_record(row)["parallelism"] == "tp8 ep8"


def test_layouts_within_a_node_are_not_folded(rows) -> None:
    e = row_plan(_row(rows, TP4_MTP2_EP2)).cfg.engine
    assert e.tensor_parallel_size == 4 and row_plan(_row(rows, TP4_MTP2_EP2)).layout == ""
    one_node = rows[(rows["mode"] == "agg") & (rows["attention_dp_size"] == 8) & (rows["moe_ep_size"] == 8)]
    plan = row_plan(one_node.iloc[0])
    assert (plan.cfg.engine.tensor_parallel_size, plan.cfg.engine.data_parallel_size) == (1, 8)
    assert plan.layout == ""


def test_attention_dp_past_a_node_is_one_nodes_attention_dp_server(rows) -> None:
    # With the benchmark's clients (the id's c64, not one rank's batch_size 1) the 64-rank reading puts
    # one client on each of 64 ranks; the id says tp8_ep8: 8 ranks of 8 clients on one node.
    row = _row(rows, ADP64)
    assert (row["tp_size"], row["attention_dp_size"], row["moe_tp_size"], row["moe_ep_size"]) == (1, 64, 8, 8)
    plan = row_plan(row)
    e = plan.cfg.engine
    assert (e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size) == (1, 8, 8)
    assert plan.layout.startswith("inferred tp1 adp8 ep8") and "64 GPUs" in plan.layout
    assert getattr(plan.cfg.workload, "concurrency", 64) == 64
    assert row_record(row)["gpus"] == 8


def test_every_disaggregated_rows_workers_run_their_own_layout(rows) -> None:
    """Each prefill and decode replica runs its own worker's TP, attention DP, EP and PP: a replica's overrides
    go over the base engine (the decode worker's), so a field one worker leaves at 1 must not be inherited
    (40 rows' prefill workers took their decode worker's EP or attention DP; 6 of them failed on it)."""
    from twinserve.sim.build import parallelism
    from twinserve.sim.config import replica_config
    from twinserve.sim.validate_rows import workers

    checked = 0
    for _, row in rows[rows["mode"] == "disagg"].iterrows():
        try:
            plan = row_plan(row)
        except NotExpressible:
            continue
        pre, dec = workers(row, plan.counts)
        c = plan.cfg.cluster
        for index, w in ((0, pre), (c.num_replicas - 1, dec)):
            p = parallelism(replica_config(plan.cfg, index))
            got = (p.tensor_parallel_size, p.data_parallel_size, p.expert_parallel_size, p.pipeline_parallel_size)
            assert got == (w.tp, w.attention_dp, w.moe_ep, w.pp), (row["id"], index)
            checked += 1
    assert checked > 1000


# vLLM rows the dumps write tp_size T, attention_dp_size T, moe_tp 1, moe_ep T x T for the matrix entry tp T, ep T
# (validate_layouts.vllm_tp_ep_layout): MiniMax-M2.5 B200 FP8 `tp4_ep4` (2026-04-06.csv) and B300 FP8 config 735.
VLLM_TP4_EP4 = "2026_04_06_minimax_m2_5_b200_sxm_vllm_fp8_agg_1024x1024_c32_tp4_ep4_1393"
VLLM_TP2_EP2 = "minimaxm2_5_b300_vllm_fp8_agg_1024x1024_c512_cfg735"


@pytest.mark.parametrize(("row_id", "t"), [(VLLM_TP4_EP4, 4), (VLLM_TP2_EP2, 2)])
def test_vllm_tp_times_ep_written_twice_is_t_gpus_at_tp_t_ep_t(rows, row_id: str, t: int) -> None:
    from twinserve.sim.validate_rows import num_gpus, parallelism

    row = _row(rows, row_id)
    assert (row["tp_size"], row["attention_dp_size"], row["moe_tp_size"], row["moe_ep_size"]) == (t, t, 1, t * t)
    plan = row_plan(row)
    e = plan.cfg.engine
    # `vllm serve --tensor-parallel-size=T --enable-expert-parallel` on T GPUs: TP T, EP T, no attention DP.
    assert (e.tensor_parallel_size, e.data_parallel_size, e.expert_parallel_size) == (t, 1, t)
    assert num_gpus(row) == t and parallelism(row) == f"tp{t} ep{t}"
    assert plan.layout.startswith(f"inferred tp{t} ep{t}")


def test_vllm_tp_ep_rows_read_as_their_2026_03_25_twins(rows) -> None:
    """Each 2026-04-06.csv vLLM row written (T, T, 1, T x T) has a 2026-03-25.csv row of the same configuration, TP
    and clients written with EP T; both read as one layout, (T, 1, 1, T)."""
    from twinserve.sim.validate_layouts import aggregated_layout

    agg = rows[(rows["mode"] == "agg") & (rows["backend"] == "vllm")]
    src = agg["silicon_data_source"].astype(str)
    new = agg[src.str.startswith("source_file=2026-04-06.csv") & (agg["attention_dp_size"] == agg["tp_size"])
              & (agg["tp_size"] > 1) & (agg["moe_tp_size"] == 1) & (agg["moe_ep_size"] == agg["tp_size"] ** 2)]
    old = agg[src.str.startswith("source_file=2026-03-25.csv") & (agg["moe_ep_size"] == agg["tp_size"])]
    image = r"image=(\S+)"
    key = ["model", "system", "precision", "tp_size", "isl", "osl", "concurrency", "image"]
    old = old.assign(image=old["silicon_data_source"].str.extract(image)[0])
    matched = 0
    for _, row in new.iterrows():
        twins = old.merge(pd.DataFrame([{**{k: row[k] for k in key[:-1]},
                                         "image": pd.Series([row["silicon_data_source"]]).str.extract(image)[0][0]}]),
                          on=key)
        assert len(twins), row["id"]
        t = int(row["tp_size"])
        assert {aggregated_layout(r) for _, r in twins.iterrows()} == {aggregated_layout(row)} == {(t, 1, 1, t)}
        matched += 1
    assert matched == 40


def test_vllm_tp_ep_layout_only_for_that_shape() -> None:
    from twinserve.sim.validate_layouts import aggregated_layout, vllm_tp_ep_layout

    def r(backend: str, tp: int, adp: int, moe_tp: int, moe_ep: int, mode: str = "agg") -> pd.Series:
        return pd.Series({"mode": mode, "backend": backend, "system": "b200_sxm", "tp_size": tp,
                          "attention_dp_size": adp, "moe_tp_size": moe_tp, "moe_ep_size": moe_ep})

    assert vllm_tp_ep_layout(r("vllm", 4, 4, 1, 16)) == (4, 1, 1, 4)
    assert aggregated_layout(r("vllm", 2, 2, 1, 4)) == (2, 1, 1, 2)
    # Another engine's writing, a vLLM attention-DP layout and a disaggregated worker stay as written.
    assert vllm_tp_ep_layout(r("sglang", 4, 4, 1, 16)) is None
    assert aggregated_layout(r("vllm", 1, 4, 1, 4)) == (1, 4, 1, 4)
    assert aggregated_layout(r("vllm", 2, 4, 1, 8)) == (2, 4, 1, 8)
    assert vllm_tp_ep_layout(r("vllm", 4, 4, 1, 16, mode="disagg")) is None
