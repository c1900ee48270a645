"""Disaggregated SGLang recipes (sim/validate_recipes.py DISAGG_RECIPES): each worker kind gets its recipe's flags."""

from __future__ import annotations

import pandas as pd
import pytest

from twinserve.sim.validate_recipes import apply_disagg_recipe, disagg_recipe

_IX = "source_file=2026-03-25.csv; model=DeepSeek-R1; silicon_concurrency={c}; image={image}"
_STP_IMAGE = "lmsysorg/sglang:v0.5.8.post1-cu130-runtime"  # dsr1-fp4-b200-dynamo-sglang (no MTP)
_MTP_IMAGE = "lmsysorg/sglang:v0.5.8.post1-cu130"  # dsr1-fp4-b200-dynamo-sglang-mtp


def _row(system: str, precision: str, isl: int, conc: int, p_tp: int, p_ep: int, d_tp: int,
         image: str = "lmsysorg/sglang:v0.5.8.post1-cu130", **kw) -> pd.Series:
    base = dict(silicon_data_source=_IX.format(c=conc, image=image), backend="sglang", model="DeepSeek-R1",
                system=system, precision=precision, mode="disagg", isl=isl, osl=1024, concurrency=conc,
                prefill_tp_size=p_tp, prefill_moe_ep_size=p_ep, decode_tp_size=d_tp)
    base.update(kw)
    return pd.Series(base)


# (row, prefill (mem, chunk, max-prefill, running), decode (mem, running)), as the recipe files set them.
@pytest.mark.parametrize("row, pre, dec", [
    # recipes/gb300-fp8/1k1k/stp/low-latency.yaml: prefill 0.95, 8192, 8192, 128; decode 0.85, 128.
    (_row("gb300", "fp8", 1024, 8, 4, 1, 4), (0.95, 8192, 8192, 128), (0.85, 128)),
    # recipes/gb300-fp8/8k1k/stp/low-latency.yaml: prefill 0.95, 32768, 32768, 128; decode 0.85, 128.
    (_row("gb300", "fp8", 8192, 4, 4, 1, 4), (0.95, 32768, 32768, 128), (0.85, 128)),
    # recipes/gb300-fp8/8k1k/stp/mid.yaml (attention DP both sides): the memory shares only.
    (_row("gb300", "fp8", 8192, 128, 8, 8, 32), (0.75, 0, 0, 0), (0.82, 0)),
    # recipes/gb300-fp4/8k1k/low_latency.yaml: prefill 0.95, 24576, -, 512; decode 0.95, -.
    (_row("gb300", "fp4", 8192, 32, 4, 1, 4), (0.95, 24576, 0, 512), (0.95, 0)),
    # recipes/gb200-fp8/8k1k/low-latency.yaml: prefill 0.8, 24576, -, 512; decode 0.8, 512.
    (_row("gb200", "fp8", 8192, 16, 8, 1, 8), (0.8, 24576, 0, 512), (0.8, 512)),
    # recipes/gb200-fp4/1k1k/low-latency.yaml: prefill 0.95, 8192, -, 512; decode 0.95, -.
    (_row("gb200", "fp4", 1024, 32, 4, 1, 4), (0.95, 8192, 0, 512), (0.95, 0)),
    # recipes/b200-fp4/8k1k/stp/low-latency-tp4-1p-tp8-1d.yaml, a non-MTP image's row.
    (_row("b200_sxm", "fp4", 8192, 16, 4, 1, 8, image=_STP_IMAGE), (0.85, 32768, 32768, 512), (0.85, 512)),
    # B200 FP8 1k/1k 1P3D at 16 clients: its STP and MTP recipes (low-latency-tep8-1p3d.yaml) set the same flags.
    (_row("b200_sxm", "fp8", 1024, 16, 8, 8, 8), (0.85, 32768, 32768, 512), (0.85, 512)),
    # H200 1k/1k 1P9D: low-latency-1p9d.yaml (decode 0.82, 256) or its -mtp twin (decode 0.75, 64): the prefill
    # worker's flags, which both set alike (0.82, 163840, 163840, 256), and none of the decode worker's.
    (_row("h200_sxm", "fp8", 1024, 1, 8, 1, 8), (0.82, 163840, 163840, 256), (0.0, 0)),
    # H200 8k/1k at 2 clients: only the MTP entry bs8-1p6d-mtp.yaml runs 2 (prefill 16 running, decode 16).
    (_row("h200_sxm", "fp8", 8192, 2, 8, 1, 8), (0.82, 32768, 32768, 16), (0.82, 16)),
    # H100 (every entry MTP) 8k/1k at 128 clients: h100-fp8-1p1d-max-tp-mtp.yaml (prefill 2 running).
    (_row("h100_sxm", "fp8", 8192, 128, 16, 1, 16), (0.6, 2048, 2048, 2), (0.9, 128)),
])
def test_a_known_launch_gives_each_worker_its_recipes_flags(row, pre, dec) -> None:
    r = disagg_recipe(row)
    assert r is not None and "srt-slurm recipes/" in r.source
    p, d = r.prefill, r.decode
    assert (p.mem_fraction, p.chunked_prefill_size, p.max_prefill_tokens, p.max_running_requests) == pre
    assert (d.mem_fraction, d.max_running_requests) == dec


@pytest.mark.parametrize("row", [
    # B200 FP4 rows from the MTP configuration's image: its recipe was not read.
    _row("b200_sxm", "fp4", 8192, 16, 4, 1, 8, image=_MTP_IMAGE),
    # B200 FP4 1k/1k (recipes/b200-fp4/1k1k/stp/*.yaml): not in the library's index.
    _row("b200_sxm", "fp4", 1024, 16, 4, 4, 8, image=_STP_IMAGE),
    # H200 1k/1k DEP 1P6D at 128 clients: bs256-1p6d-dep.yaml and its -mtp twin agree on no flag carried.
    _row("h200_sxm", "fp8", 1024, 128, 8, 8, 8),
    # a client count the matrix does not run for this configuration (an earlier matrix).
    _row("gb300", "fp8", 1024, 64, 4, 1, 4),
    # aggregated, another backend, aiconfigurator's own harness.
    _row("gb300", "fp8", 1024, 8, 4, 1, 4, mode="agg"),
    _row("gb300", "fp8", 1024, 8, 4, 1, 4, backend="trtllm"),
    _row("gb300", "fp8", 1024, 8, 4, 1, 4, silicon_data_source="source_file=/x/aic-auto-gap-analysis/rows.csv"),
])
def test_an_unsettled_launch_gets_no_recipe(row) -> None:
    assert disagg_recipe(row) is None


def test_a_flag_one_worker_sets_is_the_base_value_on_the_other() -> None:
    r = disagg_recipe(_row("gb300", "fp8", 1024, 8, 4, 1, 4))

    class _S:
        max_num_batched_tokens, max_prefill_tokens, max_num_seqs = 16384, 16384, 8

    class _E:
        gpu_memory_utilization = 0.9

    class _Base:
        scheduler, engine = _S, _E

    pre, dec = apply_disagg_recipe(r, _Base, {"engine.tensor_parallel_size": 4}, {"engine.tensor_parallel_size": 4})
    assert pre == {"engine.tensor_parallel_size": 4, "engine.gpu_memory_utilization": 0.95,
                   "scheduler.max_num_batched_tokens": 8192, "scheduler.max_prefill_tokens": 8192,
                   "scheduler.max_num_seqs": 128}
    assert dec == {"engine.tensor_parallel_size": 4, "engine.gpu_memory_utilization": 0.85,
                   "scheduler.max_num_batched_tokens": 16384, "scheduler.max_prefill_tokens": 16384,
                   "scheduler.max_num_seqs": 128}


def _dev_rows() -> pd.DataFrame:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.sim.validate_rows import load_rows
    rows = load_rows()
    return rows[(rows["backend"] == "sglang") & (rows["model"] == "DeepSeek-R1") & (rows["mode"] == "disagg")]


def test_a_gb300_rows_study_runs_each_worker_with_its_recipe() -> None:
    from twinserve.sim.validate_rows import row_study
    rows = _dev_rows()
    pick = rows[(rows["system"] == "gb300") & (rows["precision"] == "fp8") & (rows["isl"] == 1024)
                & (rows["concurrency"] == 8) & (rows["prefill_tp_size"] == 4)]
    cfg = row_study(pick.iloc[0], "aic")
    c = cfg.cluster
    assert (c.num_prefill_replicas, c.num_replicas) == (1, 5)  # 1 prefill, 4 decode workers (TP 4 each)
    pre, dec = c.replicas[0], c.replicas[1]
    assert (pre["engine.gpu_memory_utilization"], pre["scheduler.max_num_batched_tokens"],
            pre["scheduler.max_prefill_tokens"], pre["scheduler.max_num_seqs"]) == (0.95, 8192, 8192, 128)
    assert (dec["engine.gpu_memory_utilization"], dec["scheduler.max_num_seqs"]) == (0.85, 128)
    # The decode worker keeps the row study's own budget (the recipe's prefill chunk is the prefill worker's).
    assert dec["scheduler.max_num_batched_tokens"] == cfg.scheduler.max_num_batched_tokens != 8192
    assert all(r == dec for r in c.replicas[1:])


def test_an_unsettled_rows_study_keeps_the_defaults() -> None:
    from twinserve.sim.validate_rows import row_study
    rows = _dev_rows()
    pick = rows[(rows["system"] == "b200_sxm") & (rows["precision"] == "fp4") & (rows["isl"] == 1024)
                & (rows["concurrency"] == 16)]
    assert disagg_recipe(pick.iloc[0]) is None
    cfg = row_study(pick.iloc[0], "aic")
    for rep in cfg.cluster.replicas:
        assert not {"engine.gpu_memory_utilization", "scheduler.max_num_batched_tokens",
                    "scheduler.max_prefill_tokens"} & set(rep)
    assert cfg.engine.gpu_memory_utilization == 0.9


def test_a_prefill_worker_cap_reaches_only_the_prefill_replicas() -> None:
    from twinserve.sim.validate_rows import row_study
    rows = _dev_rows()
    pick = rows[(rows["system"] == "h100_sxm") & (rows["isl"] == 8192) & (rows["concurrency"] == 128)]
    cfg = row_study(pick.iloc[0], "aic")
    c = cfg.cluster
    pre, dec = c.replicas[0], c.replicas[c.num_prefill_replicas]
    assert (pre["scheduler.max_num_seqs"], pre["scheduler.max_num_batched_tokens"],
            pre["engine.gpu_memory_utilization"]) == (2, 2048, 0.6)
    assert (dec["scheduler.max_num_seqs"], dec["engine.gpu_memory_utilization"]) == (128, 0.9)


def _gb200_fp8_dep4_rows() -> pd.DataFrame:
    """The SGLang GB200 FP8 1k/1k DEP 4 1P4D run (db-dump config 227) at 16-128 clients: the dump rows and their
    db-dump twins (sim/validate_recipes.py DUMP_LAYOUT_LAUNCHES)."""
    from twinserve.sim.validate_rows import load_rows
    rows = load_rows()
    return rows[rows["id"].str.contains("gb200_sglang_fp8_disagg_1024x1024_c(?:16|64|128)_(?:tp1_ep1|cfg227)",
                                        regex=True)]


def test_the_gb200_fp8_dep4_run_takes_its_launch_scripts_memory_share_and_ep() -> None:
    from twinserve.sim.validate_rows import parallelism, row_study
    rows = _gb200_fp8_dep4_rows()
    assert len(rows) == 6 and set(rows["split"]) == {"dev", "heldout"}
    for _, row in rows.iterrows():
        r = disagg_recipe(row)
        assert r is not None and "1p_4d.sh" in r.source
        assert (r.prefill.mem_fraction, r.decode.mem_fraction) == (0.95, 0.95)
        # DeepEP (--moe-a2a-backend deepep) sets SGLang's EP to the worker's 4 GPUs, not the record's MoE TP 4.
        assert parallelism(row) == "P 1x tp1 adp4 ep4 | D 4x tp1 adp4 ep4"
    dev = rows[rows["split"] == "dev"].iloc[0]
    cfg = row_study(dev, "aic")
    c = cfg.cluster
    assert (c.num_prefill_replicas, c.num_replicas) == (1, 5)
    for rep in c.replicas:
        assert rep["engine.gpu_memory_utilization"] == 0.95
        assert rep["engine.expert_parallel_size"] == 4
        # aic holds no DeepEP timings at EP 4 (DEEPEP_MIN_EP): the workers keep its MoEDispatch.
        assert "engine.aic_moe_a2a" not in rep


def test_the_gb200_fp8_dep4_rows_simulate() -> None:
    """Before their launch was read they failed: 0.9 of a GB200 left no KV room beside 169.9 GiB of weights."""
    from twinserve.sim.validate import simulate_row
    rows = _gb200_fp8_dep4_rows()
    dev = rows[(rows["split"] == "dev") & (rows["concurrency"] == 16)].iloc[0]
    out = simulate_row((dev.to_dict(), "aic"))
    assert not out.get("sim_error"), out.get("sim_error")
    assert out["pred_tpot_ms"] > 0 and out["pred_ttft_ms"] > 0
