"""What the aiconfigurator rows need from the roofline: MLA, FP4, expert/attention-DP/pipeline layouts,
HF model ids from the installed package's configs, and the bad layouts refused by field (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim import get_hardware, get_model
from twinserve.backends.sim.aic_models import UnknownRowModelError, aic_model_configs_dir, resolve_row_model
from twinserve.backends.sim.capacity import kv_capacity
from twinserve.backends.sim.cost_model import roofline_for
from twinserve.backends.sim.parallel import Parallelism, ParallelismError, PipelineCostModel
from twinserve.backends.sim.precision import MXFP4_BYTES, NVFP4_BYTES, Precision
from twinserve.sim import cli

needs_aic = pytest.mark.skipif(aic_model_configs_dir() is None, reason="aiconfigurator-core not installed")


def _dsv3():
    return resolve_row_model("deepseek-ai/DeepSeek-V3")


@needs_aic
def test_deepseek_v3_parameters_match_the_published_totals() -> None:
    m = _dsv3()  # DeepSeek-V3 report: 671B total (the MTP module's 14B apart), 37B active
    assert m.is_mla and m.num_dense_layers == 3 and m.num_moe_layers == 58
    assert m.num_params / 1e9 == pytest.approx(671, rel=0.02)
    assert m.num_active_params / 1e9 == pytest.approx(37, rel=0.03)


@needs_aic
@pytest.mark.parametrize("path, total, active", [
    ("openai/gpt-oss-120b", 116.8, 5.13),   # OpenAI model card; active counts the LM head, not the embedding
    ("moonshotai/Kimi-K2.5", 1026.0, 32.9),  # Kimi-K2 card: 1T total, 32B active
    ("Qwen/Qwen3-235B-A22B-FP8", 235.0, 22.0),
])
def test_row_model_parameter_totals(path: str, total: float, active: float) -> None:
    m = resolve_row_model(path)
    assert m.num_params / 1e9 == pytest.approx(total, rel=0.02)
    embed = m.vocab_size * m.hidden_size if path.startswith("openai/") else 0
    assert (m.num_active_params - embed) / 1e9 == pytest.approx(active, rel=0.03)


@needs_aic
def test_mla_kv_bytes_per_token_by_hand() -> None:
    m = _dsv3().with_precision(Precision(kv_cache_dtype="fp8"))
    # One latent (kv_lora_rank 512) plus the shared rotary key (64) per layer, 61 layers, 1 byte.
    assert m.kv_bytes_per_token == (512 + 64) * 61 * 1 == 35136
    assert m.kv_bytes_per_token_per_gpu(8) == m.kv_bytes_per_token  # the latent is whole on every TP rank
    gqa = get_model("Llama-3.1-70B")
    assert gqa.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2


@needs_aic
def test_mla_attention_parameters_by_hand() -> None:
    m = _dsv3()
    h, n = 7168, 128
    q = h * 1536 + 1536 * n * (128 + 64)
    kv = h * (512 + 64) + 512 * n * (128 + 128)
    assert m.attn_params_per_layer == q + kv + n * 128 * h


def test_fp4_bytes_per_weight() -> None:
    assert NVFP4_BYTES == 0.5625 and MXFP4_BYTES == 0.53125  # 4 bits + FP8 per 16, + E8M0 per 32
    nv, mx = Precision(quantization="nvfp4"), Precision(quantization="mxfp4")
    assert nv.weight_bytes == nv.expert_weight_bytes == NVFP4_BYTES
    assert mx.expert_weight_bytes == MXFP4_BYTES and mx.weight_bytes == 2.0  # gpt-oss: experts only
    assert Precision(quantization="modelopt_fp4").quantization == "nvfp4"  # vLLM's name


def test_fp4_runs_at_the_fp4_peak_on_blackwell_only() -> None:
    nv = Precision(quantization="nvfp4")
    assert get_hardware("B200").gemm_peak(nv) == get_hardware("B200").peak_flops_fp4
    assert get_hardware("H200").gemm_peak(nv) == get_hardware("H200").peak_flops
    assert get_hardware("B200").gemm_peak(Precision(quantization="mxfp4"), experts=True) == 4500e12


def test_unknown_quantization_names_the_field() -> None:
    with pytest.raises(ValueError, match="quantization='fp3' is not one of"):
        Precision(quantization="fp3")


def _moe():
    return get_model("Qwen3-30B-A3B").with_precision(Precision(quantization="fp8"))


def test_expert_parallel_splits_expert_bytes_and_adds_all_to_all() -> None:
    m, h = _moe(), get_hardware("H200")
    one = Parallelism(1)
    ep = Parallelism(1, 8, 8)
    routed = m.routed_params * m.precision.expert_weight_bytes
    assert one.weight_bytes_per_gpu(m) - ep.weight_bytes_per_gpu(m) == pytest.approx(routed * 7 / 8)
    cost = roofline_for(m, h, ep)
    assert cost._moe_fixed > 0 and cost._moe_tok > 0
    # Same tokens per rank: the exchange is what EP adds over eight independent single-GPU engines
    # reading 1/8 of the experts each.
    base = roofline_for(m, h, Parallelism(1, 8, 8)).step_time(0, 0, 0, 0.0, 64, 64000)
    cost._moe_fixed = cost._moe_tok = 0.0
    assert cost.step_time(0, 0, 0, 0.0, 64, 64000) < base


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 512), ctx=st.integers(0, 8000), ep=st.sampled_from([1, 2, 4, 8]))
def test_more_expert_parallelism_never_reads_more_expert_bytes_per_gpu(b: int, ctx: int, ep: int) -> None:
    m, h = _moe(), get_hardware("H200")
    c = roofline_for(m, h, Parallelism(8 // ep if ep < 8 else 1, ep if ep < 8 else 8, ep))
    assert c._w_expert * c._local_experts <= roofline_for(m, h, Parallelism(1))._w_expert * m.num_experts
    assert c.step_time(0, 0, 0, 0.0, b, b * ctx) > 0


def test_pipeline_stage_split_and_memory_by_stage() -> None:
    m, h = get_model("Llama-3.1-70B").with_precision(Precision(quantization="fp8")), get_hardware("H200")
    par = Parallelism(2, 1, 1, 3)
    stage = par.stage_model(m)
    assert stage.num_layers == 27  # ceil(80 / 3): the heaviest stage
    assert par.weight_bytes_per_gpu(m) < m.weight_bytes / 2 / 2.5
    cap = kv_capacity(m, h, 2, 16, parallel=par)
    assert cap.block_bytes == 16 * stage.kv_bytes_per_token_per_gpu(2)
    cost = roofline_for(m, h, par)
    assert isinstance(cost, PipelineCostModel)
    # One sequence crosses every stage once: about the whole model's weight read, plus hand-offs.
    flat = roofline_for(m, h, Parallelism(2))
    one = cost.step_time(0, 0, 0, 0.0, 1, 1000)
    assert flat.step_time(0, 0, 0, 0.0, 1, 1000) * 0.9 < one < flat.step_time(0, 0, 0, 0.0, 1, 1000) * 1.3
    durations, _ = cost.decode_step_times(4, 4000, 3, 0.0, float("inf"))
    assert durations[0] == cost.step_time(0, 0, 0, 0.0, 4, 4000)


@pytest.mark.parametrize("par, field, allowed", [
    (Parallelism(1, 1, 7), "expert_parallel_size", "divisor of Qwen3-30B-A3B's 128 experts"),
    (Parallelism(2, 1, 4), "expert_parallel_size", "divisor of tensor_parallel_size x data_parallel_size"),
    (Parallelism(1, 1, 1, 49), "pipeline_parallel_size", "at most Qwen3-30B-A3B's 48 layers"),
    (Parallelism(3), "tensor_parallel_size", "divisor of Qwen3-30B-A3B's 32 attention heads"),
])
def test_bad_layout_names_the_field(par: Parallelism, field: str, allowed: str) -> None:
    with pytest.raises(ParallelismError) as got:
        par.check(_moe())
    assert got.value.field == field and allowed in str(got.value)


def test_expert_parallel_on_a_dense_model_is_refused() -> None:
    with pytest.raises(ParallelismError, match="has no experts"):
        Parallelism(2, 1, 2).check(get_model("Llama-3.1-8B"))


@needs_aic
def test_model_ids_resolve_from_the_package_and_unknown_ones_list_what_is_there() -> None:
    assert resolve_row_model("nvidia/DeepSeek-R1-NVFP4").num_params == resolve_row_model(
        "deepseek-ai/DeepSeek-R1").num_params
    assert resolve_row_model("meta-llama/Llama-3.1-70B").num_params == get_model("Llama-3.1-70B").num_params
    with pytest.raises(UnknownRowModelError, match="deepseek-ai/DeepSeek-R1"):
        resolve_row_model("acme/NoSuchModel-7B")


RUN = ('[workload]\nnum_requests = 8\nrate = 4.0\nprompt_dist = "uniform"\nprompt_min = 50\n'
       'prompt_max = 200\noutput_dist = "uniform"\noutput_min = 5\noutput_max = 20\n')


def _run(tmp_path: Path, engine: str, capsys) -> tuple[int, str]:
    f = tmp_path / "study.toml"
    f.write_text("[engine]\n" + engine + RUN)
    rc = cli.main(["run", "--config", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@needs_aic
def test_a_deepseek_study_with_expert_and_attention_dp_runs(tmp_path, capsys) -> None:
    rc, err = _run(tmp_path, 'model = "deepseek-ai/DeepSeek-R1"\nhardware = "h200_sxm"\nquantization = "fp8"\n'
                   'kv_cache_dtype = "fp8"\ntensor_parallel_size = 1\ndata_parallel_size = 8\n'
                   'expert_parallel_size = 8\n', capsys)
    assert rc == 0, err
    text = (tmp_path / "o" / "summary.md").read_text()
    assert "8x h200_sxm (TP 1, DP 8, EP 8)" in text
    row = pd.read_csv(tmp_path / "o" / "summary.csv").iloc[0]
    assert 0 < row.mfu < 1 and 0 < row.mbu < 1  # over the 8 GPUs, not the TP size


def test_attention_dp_pool_is_the_ranks_pools_together() -> None:
    m, h = _moe(), get_hardware("H200")
    one = kv_capacity(m, h, 1, 16, parallel=Parallelism(1, 1, 1))
    dp = kv_capacity(m, h, 1, 16, parallel=Parallelism(1, 4, 4))
    per_gpu = int(dp.usable_bytes // dp.block_bytes)
    assert dp.num_blocks == 4 * per_gpu and dp.weight_bytes < one.weight_bytes


@pytest.mark.parametrize("engine, field", [
    ('model = "Qwen3-30B-A3B"\nexpert_parallel_size = 3\n', "engine.expert_parallel_size"),
    ('model = "Qwen3-30B-A3B"\npipeline_parallel_size = 64\n', "engine.pipeline_parallel_size"),
    ('model = "Qwen3-30B-A3B"\npipeline_parallel_size = 0\n', "engine.pipeline_parallel_size"),
    ('model = "Qwen3-30B-A3B"\nquantization = "fp3"\n', "engine.quantization"),
])
def test_bad_layout_in_a_study_exits_2_naming_the_field(tmp_path, capsys, engine: str, field: str) -> None:
    rc, err = _run(tmp_path, 'hardware = "H200"\n' + engine, capsys)
    assert rc == 2 and field in err, err


@settings(max_examples=150, deadline=None)
@given(layout=st.sampled_from([(1, 1, 1), (2, 1, 2), (1, 4, 4), (2, 4, 8), (1, 8, 1)]),
       mla=st.booleans(), num_seqs=st.integers(1, 600), context=st.integers(0, 2_000_000),
       max_steps=st.integers(0, 120), start=st.floats(0.0, 1e4))
def test_decode_step_times_equal_step_time_under_every_layout(layout, mla, num_seqs, context, max_steps,
                                                              start) -> None:
    m = _dsv3() if mla and aic_model_configs_dir() is not None else _moe()
    tp, dp, ep = layout
    cost = roofline_for(m, get_hardware("B200"), Parallelism(tp, dp, ep))
    durations, ends = cost.decode_step_times(num_seqs, context, max_steps, start, float("inf"))
    t, c = start, context
    for d, end in zip(durations, ends):
        assert d == cost.step_time(0, 0, 0, 0.0, num_seqs, c)  # the same floats, bit for bit
        t += d
        assert end == t
        c += num_seqs
    assert len(durations) == max_steps
