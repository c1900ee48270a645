"""Disaggregated rows take their worker counts and layouts from InferenceX's run matrix where it fits."""

from __future__ import annotations

import pandas as pd
import pytest

from twinserve.sim.validate import row_record
from twinserve.sim.validate_inferencex import Shape, candidates, inferencex_workers
from twinserve.sim.validate_rows import row_plan

pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")

# B200 FP4 TensorRT-LLM 8k/1k at 658 clients: 5 prefill (TP 4, EP 4, DP attention), 2 decode (TP 8, EP 8,
# DP attention) workers, MTP 3, in both dumps.
MATCHED = ("2026_03_25_deepseek_r1_b200_sxm_trtllm_fp4_disagg_8192x1024_c658_tp4_0_ep4_0_1165",
           "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp4_disagg_8192x1024_c658_tp4_ep4_1529")
# B200 FP8 1k/1k at 32 clients with prefill EP 8: two entries fit and disagree on the workers (rows with a twin
# record, sim/validate_twins.py, take its workers instead: these three have none).
AMBIGUOUS = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c32_tp8_0_ep8_0_402"
# B200 FP8 8k/1k measured 2026-03-23 with prefill EP 1 (its recipes' prefill): the MTP entry at 48 clients with that
# prefill worker; the same run's plain rows (32 clients) fit no entry and keep their twin record.
PREFILL_EP1_MTP = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_8192x1024_c48_tp8_0_ep1_0_383"
PREFILL_EP1_PLAIN = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_8192x1024_c32_tp8_0_ep1_0_432"
# H200 8k/1k at 9 clients: no recipe read gives 9.
UNLISTED = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_8192x1024_c9_tp8_0_ep8_0_448"
# B200 FP4 1k/1k at 10 clients: an MTP and a plain entry, with the same workers. The dumps hold both runs: the one
# with a db-dump twin (config 320) is the plain one, but its own fits keep both entries; the other run (both dumps)
# is told apart from it (sim/validate_twins.py add_plain_siblings) and ran the MTP entry.
MTP_OR_NOT = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp4_disagg_1024x1024_c10_tp4_0_ep4_0_1152"
MTP_BESIDE_PLAIN = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp4_disagg_1024x1024_c10_tp4_ep4_1525"
# B300 FP4 1k/1k at 10 clients: MTP with TP 8 decode workers, plain with TP 4; the row's decode TP picks.
B300_TP4, B300_TP8 = ("2026_03_25_deepseek_r1_b300_sxm_trtllm_fp4_disagg_1024x1024_c10_tp2_0_ep2_0_1219",
                      "2026_03_25_deepseek_r1_b300_sxm_trtllm_fp4_disagg_1024x1024_c10_tp2_0_ep2_0_1229")


def _row(rows: pd.DataFrame, row_id: str) -> pd.Series:
    hit = rows[rows["id"] == row_id]
    assert len(hit) == 1, row_id
    return hit.iloc[0]


@pytest.mark.parametrize("row_id", MATCHED)
def test_a_matched_row_past_the_mtp_cap_records_its_mtp_and_runs_without_drafts(rows, row_id: str,
                                                                                   monkeypatch) -> None:
    import twinserve.sim.validate_inferencex as vi
    import twinserve.sim.validate_rows as vr
    for mod in (vi, vr):
        monkeypatch.setattr(mod, "MTP_SIMULATED_MAX_CLIENTS", 256)
    plan = row_plan(_row(rows, row_id))
    # 658 clients: past MTP_SIMULATED_MAX_CLIENTS the entry's MTP is recorded, and says it is not simulated.
    assert plan.layout.startswith("InferenceX config: 5 prefill, 2 decode workers; ran MTP 3 (not simulated past 256")
    assert not plan.cfg.speculative.enabled


@pytest.mark.parametrize("row_id", MATCHED)
def test_a_matched_row_runs_the_files_workers_and_layouts(rows, row_id: str) -> None:
    row = _row(rows, row_id)
    plan = row_plan(row)
    assert plan.counts == (5, 2)
    c = plan.cfg.cluster
    assert (c.num_prefill_replicas, c.num_replicas) == (5, 7)
    # The ctx workers run without TensorRT-LLM's overlap scheduler (srt-slurm's recipes; sim/validate_rows.py).
    prefill = {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 4, "engine.expert_parallel_size": 4,
               "scheduler.overlap_scheduler": False}
    # The decode workers' recipe (connorcarpenter15/srt-slurm @5a156f6
    # b200-fp4/8k1k/mtp/ctx5_gen2_dep8_batch32_eplb0_mtp3.yaml) sets max_batch_size 32 a rank: 512 slots, 658 clients.
    decode = {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 8, "engine.expert_parallel_size": 8,
              "scheduler.max_num_seqs": 32}
    assert c.replicas == [prefill] * 5 + [decode] * 2
    # 658 clients: within MTP_SIMULATED_MAX_CLIENTS (drafting batches advance in windows: sim/spec_window.py)
    # the entry's MTP depth drafts.
    assert plan.layout.startswith("InferenceX config: 5 prefill, 2 decode workers; ran MTP 3 (simulated")
    assert plan.cfg.speculative.enabled and plan.cfg.speculative.num_speculative_tokens == 3
    rec = row_record(row)
    assert rec["layout"] == plan.layout
    assert rec["gpus"] == 5 * 4 + 2 * 8
    assert rec["parallelism"] == "P 5x tp1 adp4 ep4 | D 2x tp1 adp8 ep8"


def test_an_unlisted_row_keeps_the_assumption_and_says_so(rows) -> None:
    row = _row(rows, UNLISTED)
    assert inferencex_workers(row) is None
    plan = row_plan(row, disagg="kv_fit_rate")
    assert plan.layout.startswith("assumed kv_fit_rate:")


def test_a_prefill_ep1_row_runs_the_mtp_entry_with_its_recipes_prefill(rows) -> None:
    row = _row(rows, PREFILL_EP1_MTP)
    m = inferencex_workers(row)
    assert m is not None and (m.prefill, m.decode, m.mtp) == (Shape(1, 8, 1, True), Shape(6, 8, 1, False), 3)
    plan = row_plan(row)
    assert plan.counts == (1, 6) and plan.cfg.speculative.num_speculative_tokens == 3
    prefill = {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 8, "engine.expert_parallel_size": 1}
    assert {k: plan.cfg.cluster.replicas[0].get(k, 1) for k in prefill} == prefill
    assert "recipes/trtllm/b200-fp8/8k1k @e71238b" in plan.layout
    plain = _row(rows, PREFILL_EP1_PLAIN)
    assert candidates(plain) == [] and row_plan(plain).layout.startswith("twin record")


def test_an_ambiguous_match_is_not_used(rows) -> None:
    row = _row(rows, AMBIGUOUS)
    assert len(candidates(row)) == 2
    assert inferencex_workers(row) is None
    assert row_plan(row, disagg="kv_fit_rate").layout.startswith("assumed kv_fit_rate:")


def test_by_default_an_ambiguous_row_runs_the_entry_with_the_most_decode_workers_flagged(rows) -> None:
    """The `entry` assumption: of the two entries that fit (8 TP 8 decode workers with MTP 3, or 3 without), the
    study runs the first: its workers, its layouts, its decode batch and its drafts, and the row says so."""
    row = _row(rows, AMBIGUOUS)
    plan = row_plan(row)
    assert plan.counts == (1, 8)
    assert plan.layout.startswith("assumed entry (2 entries fit, the most decode workers, then the deepest MTP): "
                                  "InferenceX config: 1 prefill, 8 decode workers; ran MTP 3 (simulated")
    c = plan.cfg.cluster
    assert (c.num_prefill_replicas, c.num_replicas) == (1, 9)
    assert {k: c.replicas[0][k] for k in ("engine.tensor_parallel_size", "engine.data_parallel_size")} == {
        "engine.tensor_parallel_size": 1, "engine.data_parallel_size": 8}  # the entry's DEP 8 prefill
    assert c.replicas[-1]["engine.tensor_parallel_size"] == 8 and c.replicas[-1]["scheduler.max_num_seqs"] == 4
    assert plan.cfg.speculative.num_speculative_tokens == 3
    rec = row_record(row)
    assert rec["gpus"] == 8 + 8 * 8 and rec["parallelism"] == "P 1x tp1 adp8 ep8 | D 8x tp8"


# GB200 FP4 TensorRT-LLM 8k/1k of the 2026-04-06 dump at 538 clients, prefill TP 64 at EP 1: no entry of that shape.
NO_ENTRY_OF_ITS_SHAPE = "2026_04_06_deepseek_r1_gb200_trtllm_fp4_disagg_8192x1024_c538_tp64_ep1_1112"


def test_by_default_a_row_no_entry_lists_runs_the_nearest_entry_of_its_shape(rows) -> None:
    """H200 8k/1k at 9 clients: no recipe lists 9; the nearest of its shape (prefill TP 8 EP 8, decode TP 8) are
    the two 28-client recipes (7 decode workers, MTP 3 or none): MTP 3 breaks the tie. A row without any entry of
    its shape keeps kv_fit_rate's counts."""
    from twinserve.sim.validate_inferencex import _same_shape_nearest, assumed_entry
    row = _row(rows, UNLISTED)
    assert candidates(row) == [] and {e.concs for e in _same_shape_nearest(row)} == {(28,)}
    m = assumed_entry(row)
    assert m is not None and (m.decode, m.mtp) == (Shape(7, 8, 8, False), 3)
    plan = row_plan(row)
    assert plan.counts == (1, 7) and plan.cfg.speculative.num_speculative_tokens == 3
    assert plan.layout.startswith("assumed entry (none at 9 clients; 2 of its shape nearest in clients")
    other = _row(rows, NO_ENTRY_OF_ITS_SHAPE)
    assert assumed_entry(other) is None
    assert row_plan(other).layout.startswith("assumed kv_fit_rate:")


def test_entries_agreeing_on_workers_but_not_mtp_give_the_workers_and_no_mtp(rows) -> None:
    row = _row(rows, MTP_OR_NOT)
    assert {e.mtp for e in candidates(row)} == {0, 3}
    m = inferencex_workers(row)
    assert m is not None and m.mtp is None
    assert (m.prefill.count, m.decode.count) == (1, 5)
    plan = row_plan(row)
    assert plan.counts == (1, 5) and "MTP or not" in plan.layout
    beside = _row(rows, MTP_BESIDE_PLAIN)
    m = inferencex_workers(beside)
    assert m is not None and m.mtp == 3 and (m.prefill.count, m.decode.count) == (1, 5)
    assert "ran MTP 3 (simulated" in row_plan(beside).layout


def test_the_rows_decode_tp_picks_between_entries(rows) -> None:
    tp4, tp8 = inferencex_workers(_row(rows, B300_TP4)), inferencex_workers(_row(rows, B300_TP8))
    assert tp4 is not None and tp8 is not None
    assert (tp4.decode, tp4.mtp) == (Shape(5, 4, 4, False), 0)
    assert (tp8.decode, tp8.mtp) == (Shape(5, 8, 8, False), 3)


# B300 FP8 TensorRT-LLM 8k/1k (prefill TP 4, EP 1; decode TP 8): nvidia-master.yaml @0004cf5's
# dsr1-fp8-b300-dynamo-trt 8k/1k entries.
B300_FP8_8K = "2026_03_25_deepseek_r1_b300_sxm_trtllm_fp8_disagg_8192x1024_c{}"
B300_FP8_8K_72, B300_FP8_8K_16 = B300_FP8_8K.format("72_tp4_0_ep1_0_747"), B300_FP8_8K.format("16_tp4_0_ep1_0_881")
B300_FP8_8K_5, B300_FP8_8K_256 = B300_FP8_8K.format("5_tp4_0_ep1_0_750"), B300_FP8_8K.format("256_tp4_0_ep1_0_758")


def test_a_b300_fp8_8k_row_runs_its_matrix_entrys_workers_mtp_and_batch(rows) -> None:
    """72 clients: mtp/ctx1_gen1_dp8_batch8_eplb0_mtp3_72 (1 prefill TP 4 attention DP at EP 1; 1 decode TP 8
    attention DP at EP 1, max_batch_size 8 a rank; MTP 3); 16: stp/ctx1_gen8_tp8_batch2_eplb0_mtp0_16 (8 TP 8
    decode workers, TP attention, max_batch_size 2, no MTP)."""
    row = _row(rows, B300_FP8_8K_72)
    m = inferencex_workers(row)
    assert m is not None and (m.prefill, m.decode, m.mtp, m.decode_batch) == (
        Shape(1, 4, 1, True), Shape(1, 8, 1, True), 3, 8)
    plan = row_plan(row)
    assert plan.counts == (1, 1)
    assert plan.layout.startswith("InferenceX config: 1 prefill, 1 decode workers; ran MTP 3 (simulated")
    assert plan.cfg.speculative.enabled and plan.cfg.speculative.num_speculative_tokens == 3
    prefill, decode = plan.cfg.cluster.replicas
    assert (prefill["engine.tensor_parallel_size"], prefill["engine.data_parallel_size"]) == (1, 4)
    assert (decode["engine.tensor_parallel_size"], decode["engine.data_parallel_size"]) == (1, 8)
    assert decode["scheduler.max_num_seqs"] == 8
    assert row_record(row)["parallelism"] == "P 1x tp1 adp4 | D 1x tp1 adp8"
    row = _row(rows, B300_FP8_8K_16)
    m = inferencex_workers(row)
    assert m is not None and (m.prefill, m.decode, m.mtp, m.decode_batch) == (
        Shape(1, 4, 1, True), Shape(8, 8, 1, False), 0, 2)
    plan = row_plan(row)
    assert plan.counts == (1, 8) and not plan.cfg.speculative.enabled
    assert plan.cfg.cluster.replicas[-1]["engine.tensor_parallel_size"] == 8
    assert plan.cfg.cluster.replicas[-1]["scheduler.max_num_seqs"] == 2
    assert row_record(row)["gpus"] == 4 + 8 * 8


def test_b300_fp8_8k_rows_no_single_entry_gives_take_a_flagged_entry(rows) -> None:
    """5 clients (a count no entry lists: _UNLISTED_COUNTS): the nearest entry of its shape, 8 clients' 4 TP 8 decode
    workers with MTP 3. 256 (two entries: 2 prefill + 1 DP 8 decode, or 3 prefill + 5 TP 8 decode, both plain): the
    one with the most decode workers."""
    from twinserve.sim.validate_inferencex import _UNLISTED_COUNTS
    assert _UNLISTED_COUNTS[("trtllm", "b300_sxm", "fp8", 8192, 1024)] == (5, 10)
    row = _row(rows, B300_FP8_8K_5)
    assert candidates(row) == [] and inferencex_workers(row) is None
    plan = row_plan(row)
    assert plan.counts == (1, 4) and plan.cfg.speculative.num_speculative_tokens == 3
    assert plan.layout.startswith("assumed entry (none at 5 clients; 1 of its shape nearest in clients")
    row = _row(rows, B300_FP8_8K_256)
    assert {(e.prefill.count, e.decode.count) for e in candidates(row)} == {(2, 1), (3, 5)}
    plan = row_plan(row)
    assert plan.counts == (3, 5) and not plan.cfg.speculative.enabled
    assert plan.layout.startswith("assumed entry (2 entries fit, the most decode workers")


def test_aggregated_and_other_models_are_never_matched(rows) -> None:
    row = _row(rows, MATCHED[1]).copy()
    assert inferencex_workers(row) is not None
    for col, v in (("mode", "agg"), ("model", "DeepSeek-V3"), ("silicon_data_source", "db-dump/2026-04-27")):
        other = row.copy()
        other[col] = v
        assert inferencex_workers(other) is None, col


def test_shape_fields_split_the_gpus() -> None:
    assert Shape(1, 8, 8, True).fields() == (1, 8, 1, 8)
    assert Shape(1, 8, 8, False).fields() == (8, 1, 1, 8)
    assert Shape(1, 8, 1, False).fields() == (8, 1, 8, 1)
    with pytest.raises(ValueError, match="multiple"):
        Shape(1, 8, 3, False).fields()


def test_each_transcribed_configuration_runs_exactly_the_dumps_client_counts(rows) -> None:
    # The evidence that the matrix's version is the dumps': the same client counts, no more, no fewer.
    # Configurations read from their recipes (RECIPE_SOURCES): each recipe's own benchmark count is one the dumps
    # hold (the dumps hold more, whose recipes were not read).
    # Configurations whose dumps hold two matrices' runs (_TWIN_DATED): the counts of the runs at the entries'
    # prefill EP are the table's.
    from twinserve.sim.validate_inferencex import _TWIN_DATED, _UNLISTED_COUNTS, RECIPE_SOURCES, TABLE, dumps
    d = rows[(rows["mode"] == "disagg") & (rows["model"] == "DeepSeek-R1")]
    for (backend, system, precision, isl, osl), entries in TABLE.items():
        src = dumps((backend, system, precision, isl, osl))
        g = d[d["silicon_data_source"].astype(str).str.startswith(src) & (d["backend"] == backend)
              & (d["system"] == system) & (d["precision"] == precision) & (d["isl"] == isl) & (d["osl"] == osl)]
        held, listed = set(g["concurrency"].astype(int)), {c for e in entries for c in e.concs}
        # Counts the dumps hold that no entry lists (_UNLISTED_COUNTS): held, and in no entry.
        unlisted = set(_UNLISTED_COUNTS.get((backend, system, precision, isl, osl), ()))
        assert unlisted <= held and not unlisted & listed, (system, precision, isl)
        held -= unlisted
        if (backend, system, precision, isl, osl) in _TWIN_DATED:
            assert held == listed, (system, precision, isl)
            for ep in {e.prefill.ep for e in entries}:
                at_ep = set(g[g["prefill_moe_ep_size"] == ep]["concurrency"].astype(int))
                assert at_ep and at_ep <= {c for e in entries if e.prefill.ep == ep for c in e.concs}, ep
        elif (backend, system, precision, isl, osl) in RECIPE_SOURCES:
            assert listed and listed <= held, (system, precision, isl)
        else:
            assert held == listed, (system, precision, isl)


def test_a_hopper_sglang_mtp_entry_keeps_its_depth_but_does_not_draft(rows) -> None:
    # H200 SGLang 8k/1k at 2 clients: only the MTP entry "1 prefill, 6 decode (TP 8)" runs 2 clients; its recipe
    # (recipes/h200/8k1k/bs8-1p6d-mtp.yaml) sets EAGLE at 2 steps, recorded but not simulated on Hopper
    # (SGLANG_HOPPER_MTP_NOT_SIMULATED): the study runs plain and the layout says why.
    row = _row(rows, "2026_04_06_deepseek_r1_h200_sxm_sglang_fp8_disagg_8192x1024_c2_tp8_ep1_1418")
    plan = row_plan(row)
    assert plan.counts == (1, 6)
    assert plan.layout.startswith("InferenceX config: 1 prefill, 6 decode workers; ran MTP 2 (not simulated: "
                                  "SGLang on Hopper")
    assert not plan.cfg.speculative.enabled
    assert [r["engine.tensor_parallel_size"] for r in plan.cfg.cluster.replicas] == [8] * 7
    # Its recipe's flags (recipes/h200/8k1k/bs8-1p6d-mtp.yaml: sim/validate_recipes.py DISAGG_RECIPES) ride along.
    assert [r["scheduler.max_num_seqs"] for r in plan.cfg.cluster.replicas] == [16] * 7


# B200 FP8 TensorRT-LLM 1k/1k at 8 clients: 1 prefill, 8 decode workers, MTP 3 (nvidia-master.yaml @0004cf5).
MTP_FEW_CLIENTS = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c8_tp8_0_ep8_0_392"


def test_an_mtp_entry_with_few_clients_drafts_with_the_models_own_layer(rows) -> None:
    plan = row_plan(_row(rows, MTP_FEW_CLIENTS))
    assert plan.counts == (1, 8) and "ran MTP 3 (simulated" in plan.layout
    spec = plan.cfg.speculative
    assert (spec.method, spec.draft_model, spec.num_speculative_tokens) == ("draft_model", "mtp", 3)


# B300 FP8 1k/1k at 2,112 clients: one prefill worker at TP 4 with DP attention and EP 1, one decode worker
# at TP 8, EP 8 (DEP 8).
PREFILL_EP1 = "2026_04_06_deepseek_r1_b300_sxm_trtllm_fp8_disagg_1024x1024_c2112_tp4_ep1_1716"


def test_a_prefill_worker_at_ep_1_keeps_ep_1_under_a_decode_worker_at_ep_8(rows) -> None:
    """A replica's overrides go over the base engine (the decode worker's layout): a field the prefill
    worker leaves at 1 is written as 1, not inherited (the study failed: EP 8 over 4 GPUs)."""
    from twinserve.sim.build import build_cost_models, parallelism
    from twinserve.sim.config import replica_config

    plan = row_plan(_row(rows, PREFILL_EP1))
    c = plan.cfg.cluster
    assert (c.num_prefill_replicas, c.num_replicas) == (1, 2)
    pre, dec = replica_config(plan.cfg, 0), replica_config(plan.cfg, 1)
    assert (parallelism(pre).tensor_parallel_size, parallelism(pre).data_parallel_size,
            parallelism(pre).expert_parallel_size) == (1, 4, 1)
    assert (parallelism(dec).tensor_parallel_size, parallelism(dec).data_parallel_size,
            parallelism(dec).expert_parallel_size) == (1, 8, 8)
    for cfg in (pre, dec):
        model = build_cost_models(cfg)[0]
        parallelism(cfg).check(model)


# GB200 FP8 TensorRT-LLM 1k/1k at 9 clients: 3 TP-attention decode workers whose recipe
# (ctx1_gen3_tep8_batch2_eplb0_mtp3_9.yaml) sets max_batch_size 2; B200 FP4 8k/1k at 90 clients: 1 DP-attention
# decode worker (ctx1_gen1_dep8_batch8_eplb0_mtp3.yaml), 8 per rank over 8 ranks.
TEP_CAPPED = "2026_03_25_deepseek_r1_gb200_trtllm_fp8_disagg_1024x1024_c9_tp8_0_ep8_0_1039"
DEP_CAPPED = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp4_disagg_8192x1024_c90_tp4_ep4_1260"
# B200 FP8 1k/1k at 1,600 clients: 2 DEP 8 decode workers whose recipe (ctx1_gen2_dep8_batch768_eplb0_mtp2_1600.yaml
# @fe2cd90) sets max_batch_size 96 a rank: 768 a worker, 1,536 in all for 1,600 clients (past 256: transcribed).
DEP_CAPPED_1600 = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c1600_tp8_ep8_1798"
# GB300 past 256 clients (read from the recipes): FP4 1k/1k at 2,253 clients, 1 DEP 32 decode worker whose recipe
# (connorcarpenter15/srt-slurm @5a156f6 gb300-fp4/1k1k/stp/ctx3_gen1_dep32_batch64_eplb0_mtp0.yaml) sets
# max_batch_size 64 a rank: 2,048 slots; FP8 1k/1k at 1,229 clients, 1 DEP 32 worker (NVIDIA/srt-slurm @3aea726
# gb300-fp8/1k1k/stp/ctx2_gen1_dep32_batch32_eplb0_mtp0_1229.yaml, 32 a rank): 1,024 slots.
GB300_FP4_2253 = "2026_03_25_deepseek_r1_gb300_trtllm_fp4_disagg_1024x1024_c2253_tp2_0_ep2_0_1103"
GB300_FP8_1229 = "2026_03_25_deepseek_r1_gb300_trtllm_fp8_disagg_1024x1024_c1229_tp4_0_ep4_0_931"
# Read from the recipes the matrix names (connorcarpenter15/srt-slurm @5a156f6 recipes/trtllm/,
# docs/validate-accuracy.md "caps"): B300 FP8 1k/1k at 16,384 clients, 1 attention-DP 8 decode worker at EP 1
# (b300-fp8/1k1k/stp/ctx2_gen1_dp8_batch1024_eplb0_mtp0_16384.yaml, 1,024 a rank): 8,192 slots; H100 1k/1k at 4,916,
# 1 DEP 16 worker (h100-fp8/1k1k/stp/ctx2_gen1_dep16_batch256_eplb0_mtp0.yaml, 256 a rank): 4,096; GB200 FP8 8k/1k at
# 1,229, 1 DEP 16 worker (gb200-fp8/8k1k/stp/ctx5_gen1_dep16_batch64_eplb0_mtp0_1229.yaml, 64 a rank): 1,024.
B300_FP8_16384 = "2026_04_06_deepseek_r1_b300_sxm_trtllm_fp8_disagg_1024x1024_c16384_tp4_ep1_1481"
H100_4916 = "2026_04_06_deepseek_r1_h100_sxm_trtllm_fp8_disagg_1024x1024_c4916_tp16_ep16_1759"
GB200_FP8_1229 = "2026_04_06_deepseek_r1_gb200_trtllm_fp8_disagg_8192x1024_c1229_tp8_ep8_1604"


@pytest.mark.parametrize(("row_id", "workers", "slots"), [(TEP_CAPPED, (1, 3), 2), (DEP_CAPPED, (1, 1), 64),
                                                          (DEP_CAPPED_1600, (1, 2), 768),
                                                          (GB300_FP4_2253, (3, 1), 2048),
                                                          (GB300_FP8_1229, (2, 1), 1024),
                                                          (B300_FP8_16384, (2, 1), 8192), (H100_4916, (2, 1), 4096),
                                                          (GB200_FP8_1229, (5, 1), 1024)])
def test_a_decode_worker_admits_only_its_recipes_batch(rows, row_id: str, workers: tuple[int, int],
                                                       slots: int) -> None:
    from twinserve.sim.config import replica_config
    row = _row(rows, row_id)
    m = inferencex_workers(row)
    assert m is not None and m.decode_slots() == slots
    plan = row_plan(row)
    assert plan.counts == workers
    cfg, pre = plan.cfg, workers[0]
    # Fewer slots than clients: the rest wait for the decode worker, and that wait is their TTFT.
    assert slots < int(row["concurrency"])
    for i in range(cfg.cluster.num_replicas):
        rc = replica_config(cfg, i)
        # The field is a rank's under attention DP: sim/build.py pools data_parallel_size of them (a DEP 8
        # decode worker of 8 a rank holds 64, not 8 x 64).
        cap = rc.scheduler.max_num_seqs * rc.engine.data_parallel_size
        assert cap == (slots if i >= pre else max(int(row["concurrency"]), cap)), i
    assert all("scheduler.max_num_seqs" not in r for r in cfg.cluster.replicas[:pre])


def test_every_transcribed_decode_batch_covers_its_entrys_client_counts() -> None:
    from twinserve.sim.validate_inferencex import _DECODE_BATCH, TABLE
    for key in _DECODE_BATCH:
        for e in TABLE[key]:
            assert e.batch == () or (len(e.batch) == len(e.concs) and min(e.batch) >= 1), (key, e.concs)
            # Transcribed everywhere: every TensorRT-LLM entry's recipe file is read (past 256 clients from
            # connorcarpenter15/srt-slurm @5a156f6 where ishandhanani's branch is not in the library).
            assert e.batch, (key, e.concs)


def test_an_inferencex_disaggregated_row_picks_decode_workers_in_turn(rows) -> None:
    # Dynamo's frontend (InferenceX's disaggregated runs) picks workers round-robin by default.
    from twinserve.sim.config import StudyConfig
    assert StudyConfig().cluster.disagg_decode_router == "least_outstanding"
    for row_id in (TEP_CAPPED, MTP_OR_NOT, UNLISTED):
        assert row_plan(_row(rows, row_id)).cfg.cluster.disagg_decode_router == "round_robin", row_id


def test_an_entry_whose_recipe_is_tep_runs_tp_attention_decode_workers(rows) -> None:
    # GB200 FP4 8k/1k at 76 clients: the file says dp-attn true, the recipe it launches is
    # ctx1_gen4_tep8_batch16 (TP attention, max_batch_size 16): 4 workers x 16 slots for 76 clients.
    m = inferencex_workers(_row(rows, "2026_03_25_deepseek_r1_gb200_trtllm_fp4_disagg_8192x1024_c76_tp4_0_ep4_0_382"))
    assert m is not None and m.decode == Shape(4, 8, 8, False) and m.decode_slots() == 16


# B200 FP8 TensorRT-LLM 8k/1k at 8 clients: two entries fit (6 or 2 TP 8 decode workers), both MTP 3.
AGREED_MTP = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_8192x1024_c8_tp8_0_ep8_0_718"


def test_entries_disagreeing_on_workers_but_not_mtp_draft_at_that_depth(rows) -> None:
    from twinserve.sim.validate_inferencex import agreed_mtp
    row = _row(rows, AGREED_MTP)
    assert inferencex_workers(row) is None and {e.mtp for e in candidates(row)} == {3}
    assert agreed_mtp(row) == 3
    plan = row_plan(row, disagg="kv_fit_rate")
    assert plan.layout.startswith("assumed kv_fit_rate:")  # the counts stay assumed
    assert "every InferenceX entry at 8 clients ran MTP 3" in plan.layout
    spec = plan.cfg.speculative
    assert (spec.method, spec.draft_model, spec.num_speculative_tokens) == ("draft_model", "mtp", 3)


def test_entries_disagreeing_on_workers_and_mtp_leave_the_row_undrafted(rows) -> None:
    from twinserve.sim.validate_inferencex import agreed_mtp
    row = _row(rows, AMBIGUOUS)  # B200 FP8 1k/1k at 32 clients: one entry MTP 3, the other none
    assert {e.mtp for e in candidates(row)} == {0, 3} and agreed_mtp(row) is None
    plan = row_plan(row, disagg="kv_fit_rate")
    assert not plan.cfg.speculative.enabled and "ran MTP" not in plan.layout


# H200 FP8 TensorRT-LLM, read from the srt-slurm recipes (RECIPE_SOURCES): 1k/1k at 88 clients is
# c8_ctx1_gen11_tep8_batch128_eplb0_mtp3 (benchmark concurrencies "88"): 1 prefill (TP 8, EP 8, attention DP),
# 11 TEP 8 decode workers, MTP 3, max_batch_size 128.
H200_MTP = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c88_tp8_0_ep8_0_657"
# 8k/1k at 64 clients: c64_ctx1_gen1_dep8_batch32_eplb0_mtp2: TEP 8 prefill, one DEP 8 decode worker, MTP 2.
H200_MTP2 = "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_disagg_8192x1024_c64_tp8_ep8_1575"
# 1k/1k at 13 clients: no recipe read gives 13.
H200_UNSETTLED = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c13_tp8_0_ep8_0_354"
# Past 88 clients (the layout audit): 1k/1k 352 is c32_ctx1_gen11_tep8_batch128_eplb0_mtp3 ("352"); 8k/1k 256 is
# c256_ctx3_gen1_dep8_batch32_eplb0_mtp2 ("256"); 1k/1k 1,024 is given by two recipes with other workers.
H200_352 = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c352_tp8_0_ep8_0_408"
H200_256 = "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_disagg_8192x1024_c256_tp8_ep8_1558"
H200_1024 = "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c1024_tp8_ep8_1521"
# 8k/1k at 28 clients: the MTP 3 and the plain c4_ctx1_gen7 recipes, the same workers.
H200_MTP_OR_NOT = "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_8192x1024_c28_tp8_0_ep8_0_388"


def test_an_h200_row_runs_its_srt_slurm_recipes_workers_and_mtp(rows) -> None:
    plan = row_plan(_row(rows, H200_MTP))
    assert plan.counts == (1, 11)
    assert plan.layout.startswith("InferenceX config: 1 prefill, 11 decode workers; ran MTP 3 (simulated")
    assert "ishandhanani/srt-slurm recipes/trtllm/h200/1k1k @4893f83" in plan.layout
    spec = plan.cfg.speculative
    assert (spec.method, spec.draft_model, spec.num_speculative_tokens) == ("draft_model", "mtp", 3)
    c = plan.cfg.cluster
    # The ctx worker's recipe caps, a rank's: 8 prompts and 8,192 tokens on each of its 8 attention-DP ranks.
    prefill = {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 8, "engine.expert_parallel_size": 8,
               "scheduler.max_num_seqs": 8, "scheduler.max_num_batched_tokens": 8192,
               "scheduler.adp_per_rank": True, "scheduler.overlap_scheduler": False}
    assert c.replicas[0] == prefill
    assert c.replicas[1]["engine.tensor_parallel_size"] == 8 and c.replicas[1]["scheduler.max_num_seqs"] == 128
    plan2 = row_plan(_row(rows, H200_MTP2))
    assert plan2.counts == (1, 1) and plan2.cfg.speculative.num_speculative_tokens == 2
    assert plan2.cfg.cluster.replicas[0]["engine.tensor_parallel_size"] == 8  # TEP 8 prefill
    # Its ctx worker: TEP 8, no attention DP: max_batch_size 2, max_num_tokens 16,640 for the worker.
    pre2 = plan2.cfg.cluster.replicas[0]
    assert (pre2["scheduler.max_num_seqs"], pre2["scheduler.max_num_batched_tokens"]) == (2, 16640)
    assert "scheduler.adp_per_rank" not in pre2
    assert plan2.cfg.cluster.replicas[1]["scheduler.max_num_seqs"] == 32  # 32 a rank (DEP 8: sim/build.py x 8)


def test_an_h200_row_no_recipe_settles_keeps_its_defaults(rows) -> None:
    row = _row(rows, H200_UNSETTLED)
    assert candidates(row) == [] and inferencex_workers(row) is None
    plan = row_plan(row, disagg="kv_fit_rate")
    assert plan.layout.startswith("assumed kv_fit_rate:") and not plan.cfg.speculative.enabled
    # No recipe: no ctx-worker caps, the pooled defaults (but the ctx workers' overlap scheduler, off).
    assert not any(k.startswith("scheduler.") and k != "scheduler.overlap_scheduler"
                   for r in plan.cfg.cluster.replicas for k in r)
    m = inferencex_workers(_row(rows, H200_MTP_OR_NOT))
    assert m is not None and m.mtp is None and m.decode == Shape(7, 8, 8, False)
    assert not row_plan(_row(rows, H200_MTP_OR_NOT)).cfg.speculative.enabled


def test_h200_rows_past_88_clients_run_their_recipes_by_total_concurrency(rows) -> None:
    m = inferencex_workers(_row(rows, H200_352))
    assert m is not None and (m.prefill, m.decode, m.mtp, m.decode_batch) == (
        Shape(1, 8, 8, True), Shape(11, 8, 8, False), 3, 128)
    m = inferencex_workers(_row(rows, H200_256))
    assert m is not None and (m.prefill, m.decode, m.mtp, m.decode_slots()) == (
        Shape(3, 8, 8, False), Shape(1, 8, 8, True), 2, 32 * 8)
    row = _row(rows, H200_1024)
    assert candidates(row) == [] and inferencex_workers(row) is None
    assert row_plan(row, disagg="kv_fit_rate").layout.startswith("assumed kv_fit_rate:")


# SGLang B200 FP4 1k/1k at 32 clients: one plain and one MTP entry, the same workers (1 prefill DEP 4, 6 TEP 8
# decode); the plain configuration ran lmsysorg/sglang:v0.5.8.post1-cu130-runtime, the MTP one ...-cu130.
SGL_FP4_MTP_IMAGE = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp4_disagg_1024x1024_c32_tp4_0_ep4_0_786"
SGL_FP4_PLAIN_IMAGE = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp4_disagg_1024x1024_c32_tp4_0_ep4_0_800"


def test_the_rows_image_tells_plain_from_mtp_where_the_configurations_differ_in_it(rows) -> None:
    plain, mtp = inferencex_workers(_row(rows, SGL_FP4_PLAIN_IMAGE)), inferencex_workers(_row(rows, SGL_FP4_MTP_IMAGE))
    assert plain is not None and mtp is not None
    assert (plain.decode, plain.mtp) == (Shape(6, 8, 8, False), 0)
    # recipes/b200-fp4/1k1k/mtp/low-latency-dep4-1p-tep8-6d.yaml: speculative-num-steps 2
    assert (mtp.decode, mtp.mtp) == (Shape(6, 8, 8, False), 2)
    assert not row_plan(_row(rows, SGL_FP4_PLAIN_IMAGE)).cfg.speculative.enabled
    assert row_plan(_row(rows, SGL_FP4_MTP_IMAGE)).cfg.speculative.num_speculative_tokens == 2
    assert "MTP or not" not in row_plan(_row(rows, SGL_FP4_PLAIN_IMAGE)).layout
    other = _row(rows, SGL_FP4_PLAIN_IMAGE).copy()
    other["silicon_data_source"] = other["silicon_data_source"].replace("-runtime", "-other")
    assert candidates(other) == []


# gpt-oss-120b TensorRT-LLM GB200, from its srt-slurm recipes (GPTOSS_TABLE): 8k/1k at 128 clients is run by
# ctx2_gen1_tp4_batch1024 (decode TP 4) and ctx2_gen1_dep2_batch512 (decode DEP 2); this row's decode TP 2 picks the
# second: 2 one-GPU prefill workers, one DEP 2 decode worker of 512 a rank. 1k/1k at 64: ctx1_gen1_tp4_batch256.
GPTOSS_DEP2 = "2026_03_25_gpt_oss_120b_gb200_trtllm_fp4_disagg_8192x1024_c128_tp1_0_ep1_0_1285"
GPTOSS_TP4 = "2026_03_25_gpt_oss_120b_gb200_trtllm_fp4_disagg_1024x1024_c64_tp1_0_ep1_0_1280"
# 1k/1k at 1,024 with decode TP 2: two recipes (one or two DEP 2 decode workers) run it.
GPTOSS_UNSETTLED = "2026_04_06_gpt_oss_120b_gb200_trtllm_fp4_disagg_1024x1024_c1024_tp1_ep1_1234"


def test_a_gpt_oss_row_runs_its_recipes_workers_picked_by_its_decode_tp(rows) -> None:
    m = inferencex_workers(_row(rows, GPTOSS_DEP2))
    assert m is not None and (m.prefill, m.decode, m.mtp, m.decode_slots()) == (
        Shape(2, 1, 1, False), Shape(1, 2, 2, True), 0, 1024)
    plan = row_plan(_row(rows, GPTOSS_DEP2))
    assert plan.counts == (2, 1) and "recipes/trtllm/gptoss-fp4" in plan.layout
    m = inferencex_workers(_row(rows, GPTOSS_TP4))
    assert m is not None and (m.prefill.count, m.decode, m.decode_batch) == (1, Shape(1, 4, 1, False), 256)
    row = _row(rows, GPTOSS_UNSETTLED)
    assert len(candidates(row)) == 0 and inferencex_workers(row) is None
    assert row_plan(row, disagg="kv_fit_rate").layout.startswith("assumed kv_fit_rate:")


def test_prefill_caps_come_only_from_recipes_read_and_ride_the_prefill_worker(rows) -> None:
    from twinserve.sim.config import replica_config
    from twinserve.sim.validate_inferencex import _PREFILL_CAPS, PREFILL_CAPS_RECIPES, RECIPE_SOURCES, TABLE
    # transcribed from a recipe read, nowhere else
    assert set(_PREFILL_CAPS) <= set(RECIPE_SOURCES) | set(PREFILL_CAPS_RECIPES)
    for key, entries in TABLE.items():
        assert all(e.prefill_caps == (0, 0) for e in entries) or key in _PREFILL_CAPS, key
    # An MTP-or-not row (both recipes set the same ctx caps) carries them; the decode workers do not.
    row = _row(rows, H200_MTP_OR_NOT)
    plan = row_plan(row)
    cfg = plan.cfg
    pre, dec = replica_config(cfg, 0).scheduler, replica_config(cfg, 1).scheduler
    assert (pre.max_num_seqs, pre.max_num_batched_tokens, pre.adp_per_rank) == (2, 16640, False)
    assert dec.max_num_batched_tokens == cfg.scheduler.max_num_batched_tokens and not dec.adp_per_rank
    assert dec.max_num_seqs == 32  # the decode worker's own recipe batch (TEP: the worker's)


# B200 FP8 TensorRT-LLM disaggregated rows with an InferenceX entry: 1k/1k at 128 clients, one attention-DP 8
# prefill worker at EP 8 and three TP 8 decode workers at EP 1 (srt-slurm recipes/trtllm/b200-fp8/1k1k/stp/
# ctx1_gen3_tp8_batch1024_eplb0_mtp0_128.yaml @fe2cd90: prefill `moe_config: backend: DEEPGEMM`, decode TRTLLM).
B200_FP8_TEP1 = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c128_tp8_ep8_1800"


def test_b200_fp8_trt_disagg_workers_at_ep1_run_trtllm_experts_under_aic(rows) -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.config import replica_config
    from twinserve.sim.validate_recipes import disagg_fp8_moe_kernel
    row = _row(rows, B200_FP8_TEP1)
    assert (disagg_fp8_moe_kernel(row, 1, False), disagg_fp8_moe_kernel(row, 8, True)) == ("trtllm", "default")
    cfg = row_plan(row, "aic").cfg
    assert replica_config(cfg, 0).engine.aic_fp8_moe_kernel == "default"  # the prefill worker, EP 8
    assert replica_config(cfg, 1).engine.aic_fp8_moe_kernel == "trtllm"  # a decode worker, EP 1
    roof = row_plan(row, "roofline").cfg
    assert all(replica_config(roof, i).engine.aic_fp8_moe_kernel == "default" for i in (0, 1))
    # Other groups keep aic's table: H200 (CUTLASS in its recipes).
    assert disagg_fp8_moe_kernel(_row(rows, H200_MTP_OR_NOT), 1, False) == "default"


# B300 FP8 TensorRT-LLM 8k/1k: 8 clients (1 prefill TP 4 attention DP, EP 1; 4 TP 8 decode workers, EP 1) and 3,072
# (7 prefill; 1 DEP 8 decode worker, EP 8). Their recipes (recipes/trtllm/b300-fp8/8k1k/mtp/
# ctx1_gen4_tp8_batch1_eplb0_mtp3_8.yaml, stp/ctx7_gen1_dep8_batch384_eplb0_mtp0_3072.yaml; connorcarpenter15/srt-slurm
# @5a156f6) set `moe_config: backend: TRTLLM` on every worker, at EP 1 and EP 8.
B300_FP8_8K_8, B300_FP8_8K_3072 = B300_FP8_8K.format("8_tp4_0_ep1_0_880"), B300_FP8_8K.format("3072_tp4_0_ep1_0_748")


def test_b300_fp8_trt_disagg_workers_run_trtllm_experts_at_ep1_and_ep8_under_aic(rows) -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.build import build_cost_models
    from twinserve.sim.config import replica_config
    from twinserve.sim.validate_recipes import disagg_fp8_moe_kernel
    row = _row(rows, B300_FP8_8K_8)
    assert (disagg_fp8_moe_kernel(row, 1, False), disagg_fp8_moe_kernel(row, 8, True)) == ("trtllm", "trtllm")
    cfg = row_plan(row, "aic").cfg
    pre, dec = replica_config(cfg, 0), replica_config(cfg, 1)
    assert (pre.engine.aic_fp8_moe_kernel, dec.engine.aic_fp8_moe_kernel) == ("trtllm", "trtllm")
    # The decode worker's price: trtllm-gen experts (aic's SGLang rows) under aic's DeepGEMM rows at a verify step's
    # 4 rows (batch 1, MTP 3), as on B200 at the same TP 8 decode shape.
    cost = build_cost_models(dec)[3]
    assert "trtllm-gen FP8 experts" in cost.describe()
    dec.engine.aic_fp8_moe_kernel = "default"
    deepgemm = build_cost_models(dec)[3]
    assert cost.decode_tokens_time(4) < 0.75 * deepgemm.decode_tokens_time(4)
    wide = row_plan(_row(rows, B300_FP8_8K_3072), "aic").cfg
    last = replica_config(wide, wide.cluster.num_replicas - 1).engine  # the decode worker (after 7 prefill)
    assert (last.data_parallel_size, last.expert_parallel_size) == (8, 8)  # DEP 8: MoE EP 8
    assert last.aic_fp8_moe_kernel == "trtllm"
    roof = row_plan(row, "roofline").cfg
    assert all(replica_config(roof, i).engine.aic_fp8_moe_kernel == "default" for i in (0, 1))



# GB300 FP8 TensorRT-LLM 8k/1k at 8 clients (1 prefill TP 4 attention DP, EP 4; 4 TEP 8 decode workers: TP attention,
# EP 8; MTP 3) and 1k/1k at 180 (1 prefill; 1 DEP 32 decode worker). Their recipes (recipes/trtllm/gb300-fp8/8k1k/mtp/
# ctx1_gen4_tep8_batch1_eplb0_mtp3_8.yaml, 1k1k/mtp/ctx1_gen1_dep32_batch4_eplb0_mtp3_180.yaml; connorcarpenter15/
# srt-slurm @5a156f6, NVIDIA/srt-slurm @527855c) set `moe_config: backend: TRTLLM` on the TEP 8 decode worker only:
# DEEPGEMM on the attention-DP decode workers (EP 8 too, `dep8`) and on every prefill worker.
GB300_FP8_8K_8 = "2026_03_25_deepseek_r1_gb300_trtllm_fp8_disagg_8192x1024_c8_tp4_0_ep4_0_954"
GB300_FP8_1K_180 = "2026_03_25_deepseek_r1_gb300_trtllm_fp8_disagg_1024x1024_c180_tp4_0_ep4_0_941"


def test_gb300_fp8_trt_disagg_tep8_decode_workers_run_trtllm_experts_under_aic(rows) -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.build import build_cost_models
    from twinserve.sim.config import replica_config
    from twinserve.sim.validate_recipes import disagg_fp8_moe_kernel
    row = _row(rows, GB300_FP8_8K_8)
    # EP 8 runs TRTLLM under TP attention (`tep8`) and DEEPGEMM under attention DP (`dep8`); the EP 4 prefill DEEPGEMM.
    assert [disagg_fp8_moe_kernel(row, ep, adp) for ep, adp in ((8, False), (8, True), (4, True), (16, True))] == [
        "trtllm", "default", "default", "default"]
    cfg = row_plan(row, "aic").cfg
    pre, dec = replica_config(cfg, 0), replica_config(cfg, 1)
    assert (dec.engine.data_parallel_size, dec.engine.expert_parallel_size) == (1, 8)
    assert (pre.engine.aic_fp8_moe_kernel, dec.engine.aic_fp8_moe_kernel) == ("default", "trtllm")
    # The decode worker's price: aic's GB300 SGLang trtllm-gen FP8 rows (device "NVIDIA GB300") at MoE EP 8 under its
    # DeepGEMM rows at a verify step's 4 rows (batch 1, MTP 3).
    cost = build_cost_models(dec)[3]
    assert "trtllm-gen FP8 experts" in cost.describe()
    dec.engine.aic_fp8_moe_kernel = "default"
    deepgemm = build_cost_models(dec)[3]
    assert cost.decode_tokens_time(4) < deepgemm.decode_tokens_time(4)
    dep = row_plan(_row(rows, GB300_FP8_1K_180), "aic").cfg
    assert replica_config(dep, 1).engine.data_parallel_size == 32
    assert all(replica_config(dep, i).engine.aic_fp8_moe_kernel == "default" for i in (0, 1))
    roof = row_plan(row, "roofline").cfg
    assert all(replica_config(roof, i).engine.aic_fp8_moe_kernel == "default" for i in (0, 1))

# InferenceX's database dump read against the matrix (sim/validate_inferencex.py db_dump_shape): the db-dump twin of
# a development GB300 SGLang FP8 1k/1k row at 4 clients (1 prefill TP 4, 4 decode TP 4, written tp 4, moe_tp 4).
DB_DUMP_GB300 = "dsr1_gb300_sglang_fp8_disagg_1024x1024_c4_cfg517"
# The twin of an H200 TensorRT-LLM 1k/1k row at 36 clients whose prefill attention DP the db-dump writes as 1
# (tp 8, moe_ep 8): TABLE's entry comes from the srt-slurm recipe (attention DP), which the rule keeps.
DB_DUMP_H200_DP = "dsr1_h200_trtllm_fp8_disagg_1024x1024_c36_cfg303"
# B200 FP8 SGLang 1k/1k at 4 clients: two entries fit the dump row's own columns; its db-dump twin is one of them.
TWIN_PICKS = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_disagg_1024x1024_c4_tp8_0_ep8_0_532"


def test_a_db_dump_record_maps_to_its_matrix_entry_and_runs_its_recipe(rows) -> None:
    row = _row(rows, DB_DUMP_GB300)
    m = inferencex_workers(row)
    assert m is not None and m.mtp == 0
    assert (m.prefill, m.decode) == (Shape(1, 4, 1, False), Shape(4, 4, 1, False))
    plan = row_plan(row, "roofline")
    assert plan.layout.startswith("InferenceX config: 1 prefill, 4 decode workers") and plan.counts == (1, 4)
    pre, dec = plan.cfg.cluster.replicas[0], plan.cfg.cluster.replicas[-1]
    # recipes/gb300-fp8/1k1k/stp/low-latency.yaml: prefill memory 0.95, --chunked-prefill-size and
    # --max-prefill-tokens 8,192, 128 running; decode memory 0.85, 128 running (DISAGG_RECIPES)
    assert (pre["engine.gpu_memory_utilization"], pre["scheduler.max_num_batched_tokens"],
            pre["scheduler.max_prefill_tokens"], pre["scheduler.max_num_seqs"]) == (0.95, 8192, 8192, 128)
    assert (dec["engine.gpu_memory_utilization"], dec["scheduler.max_num_seqs"]) == (0.85, 128)


def test_a_db_dump_record_keeps_its_recipes_attention_dp(rows) -> None:
    row = _row(rows, DB_DUMP_H200_DP)
    assert (row["prefill_tp_size"], row["prefill_attention_dp_size"]) == (8, 1)
    m = inferencex_workers(row)
    assert m is not None and m.prefill == Shape(1, 8, 8, True) and m.decode == Shape(9, 8, 8, False)
    assert m.decode_batch == 256 and m.prefill_caps == (8, 8192)


def test_a_db_dump_twin_picks_between_the_entries_a_dump_row_fits(rows) -> None:
    row = _row(rows, TWIN_PICKS)
    assert row["twin_id"] == "dsr1_b200_sglang_fp8_disagg_1024x1024_c4_cfg455"
    m = inferencex_workers(row)
    assert m is not None and (m.prefill.count, m.decode.count) == (1, 1)
    assert inferencex_workers(_row(rows, row["twin_id"])) == m


def test_every_development_twin_pair_recovers_the_entry_of_its_dump_row(rows) -> None:
    dev = rows[(rows["model"] == "DeepSeek-R1") & (rows["mode"] == "disagg") & rows["twin_id"].notna()]
    checked = 0
    for _, row in dev.iterrows():
        own = {(e.prefill, e.decode) for e in candidates(row)}
        if len(own) != 1:
            continue
        twin = _row(rows, row["twin_id"])
        assert {(e.prefill, e.decode) for e in candidates(twin)} == own, (row["id"], twin["id"])
        checked += 1
    assert checked >= 229


def test_a_db_dump_twin_dates_a_row_of_the_other_dump(rows) -> None:
    # GB200 SGLang FP8 1k/1k at 4 clients from the 2026-04-06 dump, measured 2026-02-09 (the 2026-03-25 dump's run;
    # _ONLY_DUMP dates the configuration to that dump): its db-dump twin's layout is the entry, so the row takes it
    # and its recipe; the same dump's 2025-12-05 row at 4 clients has no twin and stays unmatched.
    row = _row(rows, "2026_04_06_deepseek_r1_gb200_sglang_fp8_disagg_1024x1024_c4_tp4_ep1_1730")
    m = inferencex_workers(row)
    assert m is not None and (m.prefill, m.decode) == (Shape(1, 4, 1, False), Shape(1, 4, 1, False))
    assert "InferenceX config: 1 prefill, 1 decode workers" in row_plan(row, "roofline").layout
    assert candidates(_row(rows, "2026_04_06_deepseek_r1_gb200_sglang_fp8_disagg_1024x1024_c4_tp20_ep1_1139")) == []


# SGLang B200 FP8 8k/1k (nvidia-master.yaml @0004cf5's dsr1-fp8-b200-dynamo-sglang(-mtp) 8k/1k entries): the dumps
# hold the runs of two matrices, so a dump row takes an entry only by its db-dump twin's layout.
SGL_B200_FP8_8K_TWIN = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_disagg_8192x1024_c128_tp8_0_ep8_0_966"
SGL_B200_FP8_8K_NO_TWIN = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_disagg_8192x1024_c128_tp8_0_ep8_0_684"


def test_a_twin_dated_row_takes_the_entry_its_db_dump_twin_is(rows) -> None:
    row = _row(rows, SGL_B200_FP8_8K_TWIN)
    assert row["twin_id"] == "dsr1_b200_sglang_fp8_disagg_8192x1024_c128_cfg457"
    m = inferencex_workers(row)
    # max-tpt-dep8-1p1d: 1 prefill and 1 decode DEP 8, plain (the MTP entry at 128 is 2P1D)
    assert m is not None and m.mtp == 0
    assert (m.prefill, m.decode) == (Shape(1, 8, 8, True), Shape(1, 8, 8, True))
    assert inferencex_workers(_row(rows, row["twin_id"])) == m
    plan = row_plan(row, "roofline")
    assert "InferenceX config: 1 prefill, 1 decode workers" in plan.layout
    # qiching/srt-slurm recipes/b200-fp8/8k1k/stp/max-tpt-dep8-1p1d.yaml @5063eb4: mem-fraction-static 0.85 on both
    # (attention DP: the memory share only, DISAGG_RECIPES)
    pre, dec = plan.cfg.cluster.replicas[0], plan.cfg.cluster.replicas[-1]
    assert (pre["engine.gpu_memory_utilization"], dec["engine.gpu_memory_utilization"]) == (0.85, 0.85)
    # 32 clients, 1P1D TEP 8 (plain or MTP: both recipes set 0.85, 32,768 prefill tokens, 512 running)
    low = row_plan(_row(rows, "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_disagg_8192x1024_c32_tp8_0_ep8_0_963"),
                   "roofline").cfg.cluster.replicas[0]
    assert (low["scheduler.max_prefill_tokens"], low["scheduler.max_num_seqs"]) == (32768, 512)
    # The prefill-EP-1 run (recipes/b200-fp8/8k1k.yaml @50f459c): at 128 clients its 1P4D TP 8 decode at EP 1 (the
    # twin's layout; 1P3D runs 128 too), plain or MTP, decode max-running-requests 32, prefill memory 0.6.
    ep1 = _row(rows, "2026_04_06_deepseek_r1_b200_sxm_sglang_fp8_disagg_8192x1024_c128_tp8_ep1_1900")
    m1 = inferencex_workers(ep1)
    assert m1 is not None and m1.mtp is None
    assert (m1.prefill, m1.decode) == (Shape(1, 8, 1, True), Shape(4, 8, 1, False))
    reps = row_plan(ep1, "roofline").cfg.cluster.replicas
    assert (reps[0]["engine.gpu_memory_utilization"], reps[-1]["scheduler.max_num_seqs"]) == (0.6, 32)
    # The same configuration and count without a twin: not dated, unmatched.
    assert candidates(_row(rows, SGL_B200_FP8_8K_NO_TWIN)) == []
    # A db-dump record of 1 prefill and 4 decode TEP 8 at 64 clients: @0004cf5's low-latency-tep8-1p4d.
    rec = inferencex_workers(_row(rows, "dsr1_b200_sglang_fp8_disagg_8192x1024_c64_cfg453"))
    assert rec is not None and rec.decode == Shape(4, 8, 8, False) and rec.mtp == 0


def test_h200_recipes_of_one_count_are_picked_by_the_db_dump_twin(rows) -> None:
    # H200 TensorRT-LLM 8k/1k at 48 clients: srt-slurm @4893f83 c16_ctx1_gen3 and c8_ctx1_gen6 (plain and MTP each)
    # both give "48"; the twin (config 301) is 1 prefill, 6 TEP 8 decode workers.
    row = _row(rows, "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_disagg_8192x1024_c48_tp8_ep8_1542")
    m = inferencex_workers(row)
    assert m is not None and m.mtp is None and m.decode == Shape(6, 8, 8, False)
    assert m.decode_batch == 0  # batch 16 plain, 32 MTP: not known
    # 128 clients: stp/c128_ctx1_gen1_dep8_batch256 (1 TEP 8 prefill) against mtp/c128_ctx2_gen1 (2 prefill); the
    # twin (config 291) writes the prefill's attention DP, which the recipe's `enable_attention_dp: false` overrides.
    m = inferencex_workers(_row(rows, "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_8192x1024_c128_tp8_0_ep8_0_670"))
    assert m is not None and m.mtp == 0 and m.decode_batch == 256
    assert (m.prefill, m.decode) == (Shape(1, 8, 8, False), Shape(1, 8, 8, True))


# GB200 FP4 SGLang 1k/1k at 8,192 clients: 4 prefill workers at attention DP 4 x EP 4, one decode worker at attention
# DP 32 x EP 32 (NVIDIA/srt-slurm recipes/gb200-fp4/1k1k/mid-curve.yaml: decode `moe-a2a-backend: deepep`,
# `deepep-mode: low_latency`); H200 FP8 SGLang 1k/1k at 1,024 clients, 6 DEP 8 decode workers (no a2a backend).
GB200_FP4_DEP32 = "2026_03_25_deepseek_r1_gb200_sglang_fp4_disagg_1024x1024_c8192_tp4_0_ep4_0_843"
H200_DEP8 = "2026_04_06_deepseek_r1_h200_sxm_sglang_fp8_disagg_1024x1024_c1024_tp8_ep8_1718"


def test_gb200_sglang_wide_ep_decode_runs_deepep_low_latency_under_aic(rows) -> None:
    # Its FP4 DEP 4 prefill workers set no a2a backend: they keep aic's MoEDispatch (prefill_moe_a2a).
    from twinserve.sim.config import replica_config
    from twinserve.sim.validate_inferencex import decode_moe_a2a
    cfg = row_plan(_row(rows, GB200_FP4_DEP32), "aic").cfg
    n = len(cfg.cluster.replicas)
    assert [replica_config(cfg, i).engine.aic_moe_a2a for i in range(n)] == ["default"] * (n - 1) + ["deepep_ll"]
    assert replica_config(cfg, n - 1).engine.data_parallel_size == 32
    assert {replica_config(cfg, i).engine.data_parallel_size for i in range(n - 1)} == {4}
    roof = row_plan(_row(rows, GB200_FP4_DEP32), "roofline").cfg
    assert {replica_config(roof, i).engine.aic_moe_a2a for i in range(n)} == {"default"}
    h200 = row_plan(_row(rows, H200_DEP8), "aic").cfg
    assert {replica_config(h200, i).engine.aic_moe_a2a for i in range(len(h200.cluster.replicas))} == {"default"}
    assert decode_moe_a2a("sglang", "gb300", 24, 24) == "deepep_ll"
    assert decode_moe_a2a("sglang", "gb200", 1, 8) == "default"  # TEP: no attention DP
    assert decode_moe_a2a("trtllm", "gb200", 32, 32) == "default"


# DeepSeek-R1 GB200 FP4 TensorRT-LLM 8k/1k at 4,096 clients: 10 prefill workers at TP 4 / EP 4 with attention DP, one
# DEP 16 decode worker. The ctx worker of the configuration's recipe (srt-slurm gb200-fp4/8k1k/mtp/
# ctx1_gen4_tep8_batch4_eplb0_mtp3 @46d030c): `max_batch_size: 2`, `max_num_tokens: 16640` a rank, TRTLLM experts.
GB200_FP4_8K = "2026_03_25_deepseek_r1_gb200_trtllm_fp4_disagg_8192x1024_c4096_tp4_0_ep4_0_397"


def test_gb200_fp4_8k_prefill_workers_run_their_recipes_caps_a_rank_and_trtllm_experts(rows) -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.config import replica_config
    row = _row(rows, GB200_FP4_8K)
    plan = row_plan(row, "aic")
    cfg = plan.cfg
    assert plan.counts == (10, 1)
    pre, dec = replica_config(cfg, 0), replica_config(cfg, 10)
    assert (pre.engine.data_parallel_size, pre.engine.expert_parallel_size) == (4, 4)
    # each request on one rank, two prompts and 16,640 tokens a rank (not the engine's default budget, chunked)
    assert (pre.scheduler.max_num_seqs, pre.scheduler.max_num_batched_tokens, pre.scheduler.adp_per_rank) == (
        2, 16640, True)
    assert pre.engine.aic_fp8_moe_kernel == "trtllm" and not pre.engine.aic_trtllm_wide_ep
    # the decode worker keeps WIDEEP and its own batch
    assert dec.engine.aic_trtllm_wide_ep and dec.engine.aic_fp8_moe_kernel == "default"
    assert not dec.scheduler.adp_per_rank and dec.scheduler.max_num_batched_tokens != 16640
    # the expert kernel is the measured backend's knob only
    assert replica_config(row_plan(row, "roofline").cfg, 0).engine.aic_fp8_moe_kernel == "default"


@pytest.mark.parametrize("system,precision,ep,trtgen", [
    ("gb200", "fp4", 4, True),  # the recipes' ctx workers
    ("gb200", "fp4", 16, False),  # past EP 8: WIDEEP (deployment guide), not this backend
    ("gb300", "fp4", 2, False),  # no GB300 FP4 ctx recipe read
    ("gb200", "fp8", 8, False),
])
def test_gb200_fp4_prefill_workers_run_trtllm_experts(system, precision, ep, trtgen) -> None:
    from twinserve.sim.validate_recipes import disagg_prefill_trtgen
    row = pd.Series({"backend": "trtllm", "model": "DeepSeek-R1", "system": system, "precision": precision})
    assert disagg_prefill_trtgen(row, ep) is trtgen


# GB300 FP8 SGLang 1k/1k at 4,096 clients: prefill workers at attention DP 8 x EP 8 (DeepEP normal mode:
# ishandhanani/srt-slurm recipes/gb300-fp8/1k1k/stp/mid.yaml), decode at DEP 32 (DeepEP low-latency).
GB300_FP8_DEP8_PREFILL = "2026_04_06_deepseek_r1_gb300_sglang_fp8_disagg_1024x1024_c4096_tp8_ep8_1763"


def test_gb300_fp8_sglang_dep8_prefill_runs_deepep_normal_under_aic(rows) -> None:
    from twinserve.sim.config import replica_config
    from twinserve.sim.validate_inferencex import prefill_moe_a2a
    row = _row(rows, GB300_FP8_DEP8_PREFILL)
    cfg = row_plan(row, "aic").cfg
    n, p = len(cfg.cluster.replicas), cfg.cluster.num_prefill_replicas
    engines = [replica_config(cfg, i).engine for i in range(n)]
    assert [e.aic_moe_a2a for e in engines] == ["deepep_normal"] * p + ["deepep_ll"] * (n - p)
    assert {(e.data_parallel_size, e.expert_parallel_size) for e in engines[:p]} == {(8, 8)}
    roof = row_plan(row, "roofline").cfg
    assert {replica_config(roof, i).engine.aic_moe_a2a for i in range(n)} == {"default"}
    assert prefill_moe_a2a("sglang", "gb300", "fp8", 8, 8) == "deepep_normal"
    assert prefill_moe_a2a("sglang", "gb200", "fp4", 4, 4) == "default"  # FP4 DEP 4: no a2a backend
    assert prefill_moe_a2a("sglang", "gb200", "fp8", 1, 4) == "default"  # TEP prefill (the low-latency recipes)
    assert prefill_moe_a2a("sglang", "h200", "fp8", 8, 8) == "default"  # H200 / B200 recipes set no a2a backend
    assert prefill_moe_a2a("trtllm", "gb200", "fp8", 8, 8) == "default"


# Kimi-K2.5 TensorRT-LLM GB200 FP4 (held out: only the rows' non-measured columns are read here), from its srt-slurm
# STP recipes (KIMI_TABLE): 1k/1k at 4,301 clients with decode TP 8 is ctx1dep4_gen1dep8_batch768_allconc (one DEP 8
# decode worker, max_batch_size 768 a rank); 8k/1k at 2,253 with decode TP 16 is ctx7dep4_gen1dep16_batch128 (seven
# DEP 4 prefill workers, one DEP 16 decode worker); 1k/1k at 15 with decode TP 4 is ctx1dep4_gen5tep4_batch8_allconc
# (five TEP 4 decode workers of 8).
KIMI_DEP8 = "2026_03_25_kimi_k2_5_gb200_trtllm_fp4_disagg_1024x1024_c4301_tp8_0_ep_183"
KIMI_7P = "2026_03_25_kimi_k2_5_gb200_trtllm_fp4_disagg_8192x1024_c2253_tp16_0_ep_169"
KIMI_TEP4 = "2026_03_25_kimi_k2_5_gb200_trtllm_fp4_disagg_1024x1024_c15_tp4_0_ep_173"


def _dep4_prefill(seqs: int, tokens: int) -> dict:
    """A DEP 4 ctx worker with its recipe's caps, a rank's (each rank schedules its own batch), overlap off."""
    return {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 4, "engine.expert_parallel_size": 4,
            "scheduler.max_num_seqs": seqs, "scheduler.max_num_batched_tokens": tokens, "scheduler.adp_per_rank": True,
            "scheduler.overlap_scheduler": False}


def test_a_kimi_row_runs_its_recipes_workers(rows) -> None:
    for row_id, counts, decode, slots, prefill in (
            (KIMI_DEP8, (1, 1), {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 8,
                                 "engine.expert_parallel_size": 8, "scheduler.max_num_seqs": 768}, 8 * 768,
             _dep4_prefill(16, 16384)),
            (KIMI_7P, (7, 1), {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 16,
                               "engine.expert_parallel_size": 16, "scheduler.max_num_seqs": 128}, 16 * 128,
             _dep4_prefill(2, 16384)),
            (KIMI_TEP4, (1, 5), {"engine.tensor_parallel_size": 4, "engine.data_parallel_size": 1,
                                 "engine.expert_parallel_size": 4, "scheduler.max_num_seqs": 8}, 8,
             _dep4_prefill(16, 16384))):
        row = _row(rows, row_id)
        m = inferencex_workers(row)
        assert m is not None and (m.prefill.count, m.decode.count, m.mtp, m.decode_slots()) == (*counts, 0, slots)
        plan = row_plan(row)
        assert plan.counts == counts, row_id
        c = plan.cfg.cluster
        assert (c.num_prefill_replicas, c.num_replicas) == (counts[0], sum(counts))
        assert c.replicas == [prefill] * counts[0] + [decode] * counts[1], row_id
        assert not plan.cfg.speculative.enabled  # the STP recipes: no drafts
        assert plan.layout.startswith(f"InferenceX config: {counts[0]} prefill, {counts[1]} decode workers (NVIDIA/"
                                      "srt-slurm recipes/kimi2.5/trtllm_dynamo/disagg/gb200Nvfp4 STP @0858f39)")
    assert row_record(_row(rows, KIMI_7P))["parallelism"] == "P 7x tp1 adp4 ep4 | D 1x tp1 adp16 ep16"


# GLM-5 likewise (GLM5_TABLE): 8k/1k at 615 clients with decode TP 32 is ctx5dep4_gen1dep32_batch16 (five prefill
# workers; the later ctx4dep4 recipe of that count is left out); 8k/1k at 117 with decode TP 4 is
# ctx1dep4_gen3tep4_batch32 (three TEP 4 decode workers of 32).
GLM5_5P = "2026_03_25_glm_5_gb200_trtllm_fp4_disagg_8192x1024_c615_tp32_0_ep_144"
GLM5_TEP4 = "2026_03_25_glm_5_gb200_trtllm_fp4_disagg_8192x1024_c117_tp4_0_ep_143"


def test_a_glm5_row_runs_its_recipes_workers(rows) -> None:
    prefill = _dep4_prefill(2, 16640)  # 8k/1k's ctx recipes: 2 prompts, 16,640 tokens a rank
    for row_id, counts, decode in (
            (GLM5_5P, (5, 1), {"engine.tensor_parallel_size": 1, "engine.data_parallel_size": 32,
                               "engine.expert_parallel_size": 32, "scheduler.max_num_seqs": 16}),
            (GLM5_TEP4, (1, 3), {"engine.tensor_parallel_size": 4, "engine.data_parallel_size": 1,
                                 "engine.expert_parallel_size": 4, "scheduler.max_num_seqs": 32})):
        row = _row(rows, row_id)
        plan = row_plan(row)
        assert plan.counts == counts, row_id
        assert plan.cfg.cluster.replicas == [prefill] * counts[0] + [decode] * counts[1], row_id
        assert not plan.cfg.speculative.enabled
        assert plan.layout.startswith(f"InferenceX config: {counts[0]} prefill, {counts[1]} decode workers (NVIDIA/"
                                      "srt-slurm recipes/GLM5/disagg/trtllm_dynamo/gb200_nvfp4 STP @b8ae71a/@10b3798)")


@pytest.mark.parametrize("model, n", [("Kimi-K2.5", 25), ("GLM-5", 22)])
def test_the_recipes_run_exactly_the_dumps_client_counts_at_each_decode_tp(rows, model: str, n: int) -> None:
    # The dating evidence (only the rows' ids, TP columns and client counts are read): at each decode TP the STP
    # recipes' counts are the 2026-03-25 dump's, no more, no fewer, and no row fits two recipes.
    from twinserve.sim.validate_inferencex import _MODEL_TABLES
    d = rows[(rows["model"] == model) & (rows["mode"] == "disagg")
             & rows["silicon_data_source"].astype(str).str.startswith("source_file=")]
    assert set(d["silicon_data_source"].astype(str).str.split(";").str[0]) == {"source_file=2026-03-25.csv"}
    assert len(d) == n
    for (backend, system, precision, isl, osl), entries in _MODEL_TABLES[model].items():
        g = d[(d["backend"] == backend) & (d["system"] == system) & (d["precision"] == precision)
              & (d["isl"] == isl) & (d["osl"] == osl)]
        held = {(int(t), int(c)) for t, c in zip(g["decode_tp_size"], g["concurrency"])}
        listed = [(e.decode.tp, c) for e in entries for c in e.concs]
        assert held == set(listed) and len(listed) == len(set(listed)), isl
        assert all(len(candidates(row)) == 1 for _, row in g.iterrows())


def test_only_the_kimi_rows_are_matched_without_their_written_ep(rows) -> None:
    # The dumps write Kimi-K2.5's (and GLM-5's) prefill EP as 1 (the recipes run EP 4): its rows match on TP alone,
    # whatever the EP column says; DeepSeek-R1's rows still need their prefill EP to be the entry's.
    kimi = _row(rows, KIMI_DEP8).copy()
    assert int(kimi["prefill_moe_ep_size"]) == 1 and len(candidates(kimi)) == 1
    kimi["prefill_moe_ep_size"] = 4
    assert len(candidates(kimi)) == 1
    ds = _row(rows, MATCHED[1]).copy()
    assert len(candidates(ds)) == 1
    ds["prefill_moe_ep_size"] = 1
    assert candidates(ds) == []


# DeepSeek-R1 TensorRT-LLM GB200 FP4 1k/8k (RECIPE_SOURCES): the fourteen srt-slurm recipes nvidia-master.yaml's
# dsr1-fp4-gb200-dynamo-trt 1k/8k entries launch, at the recipes' own benchmark counts (28 and 7 where the file lists
# 4-48 and 5).
GB200_FP4_1K8K = ("trtllm", "gb200", "fp4", 1024, 8192)
GB200_1K8K_28 = "2026_03_25_deepseek_r1_gb200_trtllm_fp4_disagg_1024x8192_c28_tp4_0_ep4_0_404"


def _gb200_1k8k_dump_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[(rows["model"] == "DeepSeek-R1") & (rows["mode"] == "disagg") & (rows["backend"] == "trtllm")
                & (rows["system"] == "gb200") & (rows["precision"] == "fp4") & (rows["isl"] == 1024)
                & (rows["osl"] == 8192)]


def test_gb200_fp4_1k8k_recipes_run_exactly_the_dumps_client_counts_and_fit_every_row(rows) -> None:
    from twinserve.sim.validate_inferencex import RECIPE_SOURCES, TABLE
    assert GB200_FP4_1K8K in RECIPE_SOURCES
    d = _gb200_1k8k_dump_rows(rows)
    assert len(d) == 26
    listed = {c for e in TABLE[GB200_FP4_1K8K] for c in e.concs}
    assert listed == set(d["concurrency"].astype(int)) == {7, 28, 60, 128, 135, 512, 563, 2048, 3072, 4096, 6144, 8192}
    # every row of both dumps takes one entry's workers: none is left to an assumption
    for _, row in d.iterrows():
        m = inferencex_workers(row)
        assert m is not None and not m.assumed, row["id"]


def test_gb200_fp4_1k8k_at_28_clients_runs_its_recipes_seven_tep8_workers_with_mtp_3(rows) -> None:
    from twinserve.sim.config import replica_config
    plan = row_plan(_row(rows, GB200_1K8K_28))
    assert plan.counts == (1, 7)
    assert plan.layout.startswith("InferenceX config: 1 prefill, 7 decode workers; ran MTP 3 (simulated")
    spec = plan.cfg.speculative
    assert (spec.draft_model, spec.num_speculative_tokens) == ("mtp", 3)
    pre, dec = replica_config(plan.cfg, 0), replica_config(plan.cfg, 1)
    assert (dec.engine.tensor_parallel_size, dec.engine.data_parallel_size, dec.engine.expert_parallel_size) == (8, 1, 8)
    assert dec.scheduler.max_num_seqs == 4  # ctx1_gen7_tep8_batch4: 7 x 4 = the 28 clients
    assert (pre.scheduler.max_num_seqs, pre.scheduler.max_num_batched_tokens, pre.scheduler.adp_per_rank) == (
        16, 16384, True)


def test_gb200_fp4_1k8k_mtp_and_plain_runs_of_one_count_are_told_apart_by_the_twin(rows) -> None:
    # 7 and 8,192 clients: an MTP and a plain recipe with the same workers (the 2026-03-25 dump's two rows at each).
    # The run with a db-dump twin is the plain one (its fits keep both: MTP unknown, run plain); the other run of
    # the day ran the MTP recipe (sim/validate_twins.py add_plain_siblings): MTP 3 at 7 clients (drafted), MTP 1
    # at 8,192 (recorded, not simulated past MTP_SIMULATED_MAX_CLIENTS).
    d = _gb200_1k8k_dump_rows(rows)
    for conc, dec, depth in ((7, Shape(7, 8, 8, False), 3), (8192, Shape(1, 32, 32, True), 1)):
        at = d[d["concurrency"] == conc]
        assert len(at[at["silicon_data_source"].str.startswith("source_file=2026-03-25.csv")]) == 2
        for _, row in at.iterrows():
            m = inferencex_workers(row)
            twinned = isinstance(row["twin_id"], str)
            assert m is not None and m.decode == dec and m.mtp == (None if twinned else depth), row["id"]
            assert row_plan(row).cfg.speculative.enabled == (not twinned and conc <= 2560), row["id"]
        assert at["twin_id"].notna().any() and at["twin_id"].isna().any()


def test_gb200_fp4_1k8k_entries_agree_with_every_db_dump_twin_so_the_entry_comes_first(rows) -> None:
    # The db-dump twins (configs 423, 374, 239) are the same layouts the recipes give: the entry, taken before the
    # twin, moves no twin row's workers.
    from twinserve.sim.validate_inferencex import _layout_fits
    d = _gb200_1k8k_dump_rows(rows)
    twinned = d[d["twin_id"].notna()]
    assert len(twinned) == 11
    for _, row in twinned.iterrows():
        fits = candidates(row)
        assert fits and _layout_fits(GB200_FP4_1K8K, fits, row, "twin_") == fits, row["id"]
        assert row_plan(row).layout.startswith("InferenceX config:"), row["id"]
        twin = _row(rows, row["twin_id"])
        assert inferencex_workers(twin) == inferencex_workers(row), row["id"]


def test_every_sglang_mtp_entry_has_its_recipes_depth() -> None:
    # The SGLang DeepSeek-R1 MTP entries' srt-slurm recipes all set `speculative-num-steps: 2` but B200 FP8 1k/1k's
    # max-tpt-dep8-1p2d ("512x1024x2048": 1 step); none is left at MTP_DEPTH_NOT_GIVEN.
    # On Hopper the depth (2) is kept as SGLANG_HOPPER_MTP_NOT_SIMULATED: recorded, not simulated.
    from twinserve.sim.validate_inferencex import MTP_DEPTH_NOT_GIVEN, SGLANG_HOPPER_MTP_NOT_SIMULATED as HOPPER, TABLE
    sgl = {k: v for k, v in TABLE.items() if k[0] == "sglang"}
    depths = {e.mtp for v in sgl.values() for e in v}
    assert MTP_DEPTH_NOT_GIVEN not in depths and depths == {0, 1, 2, HOPPER}
    assert {k[1] for k, v in sgl.items() for e in v if e.mtp == HOPPER} == {"h100_sxm", "h200_sxm"}
    assert not [k for k, v in sgl.items() for e in v if k[1] in ("h100_sxm", "h200_sxm") and e.mtp > 0]
    ones = [(k, e) for k, v in sgl.items() for e in v if e.mtp == 1]
    assert [(k[1:], e.concs, e.decode) for k, e in ones] == [
        (("b200_sxm", "fp8", 1024, 1024), (512, 1024, 2048), Shape(2, 8, 8, True))]


# B200 FP8 SGLang 1k/1k at 8 clients: one entry, 1 prefill and 3 TEP 8 decode workers, MTP
# (recipes/b200-fp8/1k1k/mtp/low-latency-tep8-1p3d.yaml: EAGLE, 2 steps, 3 draft tokens).
SGL_B200_FP8_C8 = "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_disagg_1024x1024_c8_tp8_0_ep8_0_534"


def test_a_b200_fp8_sglang_mtp_row_drafts_two(rows) -> None:
    plan = row_plan(_row(rows, SGL_B200_FP8_C8))
    assert plan.counts == (1, 3)
    assert "ran MTP 2 (simulated: MTP_ACCEPTANCE" in plan.layout
    assert (plan.cfg.speculative.draft_model, plan.cfg.speculative.num_speculative_tokens) == ("mtp", 2)
