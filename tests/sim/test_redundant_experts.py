"""SGLang's redundant experts (engine.redundant_experts, --ep-num-redundant-experts): E + R physical experts
over the expert-parallel group, so EP 24 / 48 lay DeepSeek-R1's 256 experts out, as InferenceX ran them."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinserve.backends.sim import get_hardware
from twinserve.backends.sim.aic_models import aic_model_configs_dir, resolve_row_model
from twinserve.backends.sim.cost_model import roofline_for
from twinserve.backends.sim.parallel import Parallelism, ParallelismError
from twinserve.backends.sim.precision import Precision
from twinserve.sim import cli

needs_aic = pytest.mark.skipif(aic_model_configs_dir() is None, reason="aiconfigurator-core not installed")

RUN = ('[workload]\nnum_requests = 4\nrate = 4.0\nprompt_dist = "uniform"\nprompt_min = 50\n'
       'prompt_max = 100\noutput_dist = "uniform"\noutput_min = 3\noutput_max = 6\n')
DSR1 = ('model = "deepseek-ai/DeepSeek-R1"\nhardware = "gb200"\nquantization = "fp8"\nkv_cache_dtype = "fp8"\n'
        'tensor_parallel_size = 1\n')


def _dsr1():
    return resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision(quantization="fp8"))


def _run(tmp_path: Path, engine: str, capsys) -> tuple[int, str]:
    f = tmp_path / "study.toml"
    f.write_text("[engine]\n" + engine + RUN)
    rc = cli.main(["run", "--config", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.mark.parametrize("engine, allowed", [
    ('model = "Qwen3-30B-A3B"\nredundant_experts = -1\n', "allowed an integer in [0, 4096] (experts)"),
    ('model = "Qwen3-30B-A3B"\nredundant_experts = "many"\n', "'many' is not an integer"),
    ('model = "Qwen3-30B-A3B"\nredundant_experts = 5000\n', "allowed an integer in [0, 4096] (experts)"),
    # A dense model has no experts to replicate.
    ('model = "Llama-3.1-8B"\nredundant_experts = 8\n', "allowed 0: Llama-3.1-8B has no experts"),
])
def test_bad_redundant_experts_exit_2_naming_the_field(tmp_path, capsys, engine: str, allowed: str) -> None:
    rc, err = _run(tmp_path, 'hardware = "H200"\n' + engine, capsys)
    assert rc == 2 and "field 'engine.redundant_experts'" in err and allowed in err, err


@needs_aic
@pytest.mark.parametrize("extra", ["", "redundant_experts = 16\n"])
def test_a_split_the_physical_experts_do_not_divide_is_still_refused(tmp_path, capsys, extra: str) -> None:
    # 256 and 256 + 16 = 272 experts: neither divides by 48.
    rc, err = _run(tmp_path, DSR1 + "data_parallel_size = 48\nexpert_parallel_size = 48\n" + extra, capsys)
    assert rc == 2 and "engine.expert_parallel_size" in err, err
    assert ("272" in err) == bool(extra), err


@needs_aic
def test_256_experts_with_32_redundant_at_ep_48_hold_six_experts_a_gpu() -> None:
    m = _dsr1()
    par = Parallelism(1, 48, 48, 1, 32)
    par.check(m)
    with pytest.raises(ParallelismError, match="256 experts"):
        Parallelism(1, 48, 48).check(m)
    dense = Parallelism(1, 48, 48, 1, 32).weight_bytes_per_gpu(m) - (
        m.num_moe_layers * (256 + 32) / 48 * m.expert_params * m.precision.expert_weight_bytes)
    no_experts = (m.always_params * m.precision.weight_bytes + m.embedding_params * m.dtype_bytes)
    assert dense == pytest.approx(no_experts)  # the rest is the dense part, whole on each TP-1 rank
    # The roofline's per-GPU experts are the physical ones; its routed FLOPs per rank stay tokens x top-k / ep.
    h = get_hardware("gb200")
    wide, narrow = roofline_for(m, h, par), roofline_for(m, h, Parallelism(1, 8, 8))
    assert wide._local_experts == 6 and narrow._local_experts == 32
    assert wide._k_expert * 48 == pytest.approx(narrow._k_expert * 8)


@needs_aic
def test_a_study_at_ep_48_with_32_redundant_experts_runs(tmp_path, capsys) -> None:
    rc, err = _run(tmp_path, DSR1 + "data_parallel_size = 48\nexpert_parallel_size = 48\nredundant_experts = 32\n",
                   capsys)
    assert rc == 0, err
    assert "48x gb200 (TP 1, DP 48, EP 48)" in (tmp_path / "o" / "summary.md").read_text()


# GB300 FP4 8k/1k at 512 clients: 6 prefill workers (TP 4) and one decode worker at DP attention 48, EP 48
# (InferenceX's matrix, sim/validate_inferencex.py), whose SGLang ran 32 redundant experts.
EP48_ROW = "2026_03_25_deepseek_r1_gb300_sglang_fp4_disagg_8192x1024_c512_tp4_0_ep1_0_773"


@needs_aic
def test_an_sglang_ep_48_row_runs_with_its_redundant_experts(rows) -> None:
    from math import isfinite

    from twinserve.sim.validate import simulate_row
    from twinserve.sim.validate_rows import row_plan

    row = rows[rows["id"] == EP48_ROW].iloc[0]
    replicas = row_plan(row).cfg.cluster.replicas
    assert replicas[-1]["engine.expert_parallel_size"] == 48 and replicas[-1]["engine.redundant_experts"] == 32
    assert replicas[0]["engine.redundant_experts"] == 0  # the TP 4 prefill workers split no experts
    pred = simulate_row((row.to_dict(), "roofline", {}))
    assert isfinite(pred["pred_tpot_ms"]) and pred["pred_tpot_ms"] > 0 and pred["pred_ttft_ms"] > 0


@needs_aic
def test_aic_queries_the_moe_at_a_divisor_ep_with_the_same_tokens_per_rank() -> None:
    pytest.importorskip("aiconfigurator_core")
    from twinserve.backends.sim.aic import AicCostModel
    from twinserve.backends.sim.aic.graph import aic_moe_parallelism

    m = _dsr1()
    # aic's MoE tables hold 256 experts at EPs dividing them: EP 48 (24) is asked at EP 32 (16) with DP
    # scaled alike, so each rank still routes tokens x top-k / ep; a layout without replicas stays as it is.
    assert aic_moe_parallelism(m, Parallelism(1, 48, 48, 1, 32)) == Parallelism(1, 32, 32)
    assert aic_moe_parallelism(m, Parallelism(1, 24, 24, 1, 32)) == Parallelism(1, 16, 16)
    assert aic_moe_parallelism(m, Parallelism(1, 32, 32, 1, 32)) == Parallelism(1, 32, 32, 1, 32)
    wide = AicCostModel(m, get_hardware("gb200"), backend="sglang", parallel=Parallelism(1, 48, 48, 1, 32))
    query = AicCostModel(m, get_hardware("gb200"), backend="sglang", parallel=Parallelism(1, 32, 32))
    assert wide.decode_tokens_time(64) == query.decode_tokens_time(64) > 0
    assert wide.tokens_time(512) == query.tokens_time(512) > 0
