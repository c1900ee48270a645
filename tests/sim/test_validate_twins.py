"""A disaggregated row without worker counts takes them from the file's other record of the same run."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from twinserve.sim.validate import row_record
from twinserve.sim.validate_inferencex import inferencex_workers
from twinserve.sim.validate_rows import prepare_rows, row_plan
from twinserve.sim.validate_twins import LAYOUT_FIELDS, TWIN_ID, twin_of

pytest.importorskip("aiconfigurator_core", reason="the measured rows ship in aiconfigurator-core (extra 'aic')")

# B200 TensorRT-LLM FP8 8k/1k at 256 clients, prefill EP 1 (the 2026-03-23 run), InferenceMAX dump (no worker
# counts; no InferenceX entry: the run's plain counts fit none, sim/validate_inferencex.py _PREFILL_EP1_RUN), and its
# db-dump twin: 1 prefill worker (TP 1 x attention DP 8, EP 1), 1 decode worker (TP 1 x attention DP 8, EP 8).
# (The H200 8k/1k 128-client row this test used before now takes its srt-slurm recipe, picked by that twin.)
DUMP_ROW = "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp8_disagg_8192x1024_c256_tp8_ep1_1956"
TWIN_ROW = "dsr1_b200_trtllm_fp8_disagg_8192x1024_c256_cfg666"


def _row(rows: pd.DataFrame, row_id: str) -> pd.Series:
    hit = rows[rows["id"] == row_id]
    assert len(hit) == 1, row_id
    return hit.iloc[0]


def test_a_row_without_counts_runs_its_twins_workers(rows) -> None:
    row = _row(rows, DUMP_ROW)
    assert math.isnan(row["prefill_num_workers"]) and math.isnan(row["decode_num_workers"])
    assert inferencex_workers(row) is None  # no InferenceX entry: before, the kv_fit_rate assumption
    assert twin_of(row) == TWIN_ROW
    plan = row_plan(row)
    assert plan.counts == (1, 1)
    assert plan.layout.startswith(f"twin record {TWIN_ROW}: 1 prefill, 1 decode workers")
    c = plan.cfg.cluster
    assert (c.num_prefill_replicas, c.num_replicas) == (1, 2)
    assert c.replicas[-1]["engine.data_parallel_size"] == 8  # the twin's decode attention DP, not the dump's 1
    assert c.replicas[-1]["engine.tensor_parallel_size"] == 1
    assert (c.replicas[0]["engine.data_parallel_size"], c.replicas[0]["engine.tensor_parallel_size"]) == (8, 1)
    rec = row_record(row)
    assert rec["gpus"] == 8 * 2 and rec["layout"] == plan.layout


def test_a_twin_settles_an_ambiguous_inferencex_match(rows) -> None:
    # B200 FP8 8k/1k at 128 clients, prefill EP 8: three InferenceX entries fit and disagree on the workers;
    # the row's twin record (config 549) says 1 prefill and 1 decode worker (both attention DP 8), which is one of
    # them: the row runs that entry (sim/validate_inferencex.py candidates reads the twin's db-dump layout).
    from twinserve.sim.validate_inferencex import Shape, candidates
    row = _row(rows, "2026_04_06_deepseek_r1_b200_sxm_trtllm_fp8_disagg_8192x1024_c128_tp8_ep8_1796")
    fits = candidates(row)
    assert [(e.prefill, e.decode) for e in fits] == [(Shape(1, 8, 8, True), Shape(1, 8, 8, True))]
    assert inferencex_workers(row) is not None
    plan = row_plan(row)
    assert plan.counts == (1, 1) and plan.layout.startswith("InferenceX config: 1 prefill, 1 decode workers")


def test_twins_agree_with_every_inferencex_match(rows) -> None:
    # Two independent sources of a run's workers: the file's twin record and InferenceX's run matrix.
    checked = 0
    for _, row in rows[rows[TWIN_ID].notna()].iterrows():
        ix = inferencex_workers(row)
        if ix is None:
            continue
        assert (ix.prefill.count, ix.decode.count) == (int(row["twin_prefill_num_workers"]),
                                                       int(row["twin_decode_num_workers"])), row["id"]
        checked += 1
    assert checked >= 100


def _frame(**changes: dict) -> pd.DataFrame:
    base = dict(id="dump", backend="trtllm", system="h200_sxm", precision="fp8", mode="disagg", isl=1024,
                osl=1024, batch_size=float("nan"), attention_dp_size=float("nan"),
                model_path="deepseek-ai/DeepSeek-R1", silicon_ttft_ms=622.888743, silicon_tpot_ms=13.382414,
                **{f: float("nan") for f in LAYOUT_FIELDS})
    twin = {**base, "id": "db_c36_cfg1", "model_path": "deepseek-ai/DeepSeek-V3",
            **dict(zip(LAYOUT_FIELDS, (1, 1, 1, 8, 1, 8, 9, 8, 1, 1, 1, 8)))}
    base["id"] = "x_c36_dump"
    rows = [base, twin]
    for i, ch in changes.items():
        rows.append({**twin, **ch, "id": f"db_c36_{i}"})
    return pd.DataFrame(rows)


def test_add_twins_takes_only_one_measurement_with_one_layout() -> None:
    df = prepare_rows(_frame())
    assert twin_of(df.iloc[0]) == "db_c36_cfg1" and df.iloc[0]["twin_decode_num_workers"] == 9
    assert twin_of(df.iloc[1]) is None  # a row with its own counts borrows none
    # a second record of the same figures with other workers: no twin (the assumption stays)
    assert twin_of(prepare_rows(_frame(b={"decode_num_workers": 3})).iloc[0]) is None
    # the same layout twice is one layout
    assert twin_of(prepare_rows(_frame(b={})).iloc[0]) is not None


@pytest.mark.parametrize("change", [{"silicon_tpot_ms": 13.3834}, {"model_path": "meta-llama/Llama-3.1-70B"},
                                    {"isl": 8192}, {"system": "b200_sxm"}, {"mode": "agg"}])
def test_a_record_that_differs_is_no_twin(change: dict) -> None:
    df = _frame()
    for k, v in change.items():
        df.loc[1, k] = v
    assert twin_of(prepare_rows(df).iloc[0]) is None


# H100 TensorRT-LLM FP8 1k/1k at 6 clients, both measured 2026-02-08: nvidia-master.yaml @0004cf5 has a plain and an
# MTP 3 entry of the same workers (1 prefill DEP 16, 3 decode TEP 16). The 2026-03-25 dump holds two runs there;
# one has a db-dump twin (config 494), a plain run (the db dump holds no MTP run: sim/validate_twins.py
# add_plain_siblings), so the other ran the MTP entry.
H100_TWINNED = "2026_03_25_deepseek_r1_h100_sxm_trtllm_fp8_disagg_1024x1024_c6_tp16_0_ep16_0_859"
H100_BESIDE = "2026_03_25_deepseek_r1_h100_sxm_trtllm_fp8_disagg_1024x1024_c6_tp16_0_ep16_0_869"


def test_a_run_beside_a_twinned_plain_run_ran_the_mtp_entry(rows) -> None:
    from twinserve.sim.validate_inferencex import agreed_mtp, candidates
    from twinserve.sim.validate_twins import PLAIN_SIBLING
    twinned, beside = _row(rows, H100_TWINNED), _row(rows, H100_BESIDE)
    assert twin_of(twinned) is not None and twin_of(beside) is None
    assert {e.mtp for e in candidates(twinned)} == {0, 3}  # its own fits: the twin's layout is both entries'
    assert beside[f"{PLAIN_SIBLING}decode_num_workers"] == 3
    assert [e.mtp for e in candidates(beside)] == [3] and agreed_mtp(beside) == 3
    plan = row_plan(beside)
    assert plan.counts == (1, 3) and "ran MTP 3 (simulated" in plan.layout
    assert plan.cfg.speculative.num_speculative_tokens == 3
    assert "MTP or not" in row_plan(twinned).layout  # the twinned run's own study is unchanged


def _runs(**beside: object) -> pd.DataFrame:
    """Two InferenceMAX-dump runs of one configuration and client count, the first twinned by a db-dump record."""
    base = dict(backend="trtllm", system="h100_sxm", precision="fp8", mode="disagg", isl=1024, osl=1024,
                batch_size=float("nan"), attention_dp_size=float("nan"), model_path="deepseek-ai/DeepSeek-R1",
                silicon_data_source="source_file=2026-03-25.csv; measured=2026-02-08T01:24:15Z",
                **{f: float("nan") for f in LAYOUT_FIELDS})
    plain = {**base, "id": "a_c6_plain", "silicon_ttft_ms": 12345.08, "silicon_tpot_ms": 14.01}
    other = {**base, "id": "a_c6_other", "silicon_ttft_ms": 6909.49, "silicon_tpot_ms": 7.66, **beside}
    twin = {**plain, "id": "dsr1_h100_c6_cfg494", "model_path": "deepseek-ai/DeepSeek-V3",
            "silicon_data_source": "db-dump/2026-04-27; config_id=494",
            **dict(zip(LAYOUT_FIELDS, (1, 1, 1, 16, 1, 16, 3, 16, 1, 1, 1, 16)))}
    return pd.DataFrame([plain, other, twin])


def test_add_plain_siblings_marks_the_other_run_of_the_same_day() -> None:
    from twinserve.sim.validate_twins import PLAIN_SIBLING
    df = prepare_rows(_runs())
    col = f"{PLAIN_SIBLING}decode_num_workers"
    assert twin_of(df.iloc[0]) == "dsr1_h100_c6_cfg494" and math.isnan(df.iloc[0][col])
    assert df.iloc[1][col] == 3 and df.iloc[1][f"{PLAIN_SIBLING}decode_tp_size"] == 16
    # another day's run, or the twinned run's own figures printed again, is not told apart
    other_day = prepare_rows(_runs(silicon_data_source="source_file=2026-03-25.csv; measured=2026-02-09T00:00:00Z"))
    assert math.isnan(other_day.iloc[1][col])
    same = prepare_rows(_runs(silicon_data_source="source_file=2026-04-06.csv; measured=2026-02-08T00:00:00.000Z",
                              silicon_ttft_ms=12345.08, silicon_tpot_ms=14.01))
    assert math.isnan(same.iloc[1][col])
