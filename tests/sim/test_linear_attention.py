"""Gated DeltaNet hybrids (Qwen3.5): layer pattern, state bytes, K/V of full layers only, FLOPs, step times."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim import get_hardware
from twinserve.backends.sim.capacity import kv_capacity
from twinserve.backends.sim.cost_model import Efficiency, RooflineCostModel
from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.hf_config import ModelConfigError, load_hf_config
from twinserve.backends.sim.parallel import Parallelism, ParallelismError
from twinserve.backends.sim.precision import Precision

pytest.importorskip("aiconfigurator_core", reason="Qwen3.5's config ships in aiconfigurator-core (extra 'aic')")
from twinserve.backends.sim.aic_models import aic_model_configs_dir, resolve_row_model  # noqa: E402

QWEN35 = "Qwen/Qwen3.5-397B-A17B"


@pytest.fixture(scope="module")
def raw() -> dict:
    """The config.json aiconfigurator-core ships, read in place."""
    return json.loads((aic_model_configs_dir() / "Qwen--Qwen3.5-397B-A17B_config.json").read_text())["text_config"]


@pytest.fixture(scope="module")
def qwen35():
    return resolve_row_model(QWEN35)


def test_layer_pattern_comes_from_layer_types(qwen35, raw) -> None:
    types = raw["layer_types"]
    assert qwen35.num_linear_layers == types.count("linear_attention") == 45
    assert qwen35.num_full_attention_layers == types.count("full_attention") == 15
    assert qwen35.linear_state_dtype_bytes == 4  # mamba_ssm_dtype float32


def test_full_attention_interval_gives_the_same_pattern(tmp_path, raw) -> None:
    cfg = dict(raw)
    cfg.pop("layer_types")  # transformers' Qwen3-Next rule: every 4th layer full
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg, indent=1))
    assert load_hf_config(p).num_linear_layers == 45


def test_state_bytes_per_sequence_by_hand(qwen35, raw) -> None:
    """Per linear layer: nv/tp key x value float32 matrices and kernel-1 conv inputs of (2 nk dk + nv dv)/tp bf16."""
    nk, dk = raw["linear_num_key_heads"], raw["linear_key_head_dim"]
    nv, dv = raw["linear_num_value_heads"], raw["linear_value_head_dim"]
    for tp in (1, 2, 4, 8):
        ssm = nv // tp * dk * dv * 4
        conv = (2 * nk * dk + nv * dv) // tp * (raw["linear_conv_kernel_dim"] - 1) * 2
        assert qwen35.linear_state_bytes_per_seq_per_gpu(tp) == 45 * (ssm + conv)
    assert qwen35.linear_state_bytes_per_seq_per_gpu(8) == 45 * (8 * 128 * 128 * 4 + 1536 * 3 * 2)  # ~22.9 MiB


def test_kv_counts_only_full_attention_layers(qwen35, raw) -> None:
    kv_heads, d = raw["num_key_value_heads"], raw["head_dim"]
    assert qwen35.kv_bytes_per_token == 15 * 2 * kv_heads * d * 2
    fp8 = qwen35.with_precision(Precision("bfloat16", "fp8", "fp8"))
    assert fp8.kv_bytes_per_token_per_gpu(2) == 15 * 2 * 1 * d * 1


def test_linear_flops_per_token_from_the_head_dims(qwen35, raw) -> None:
    nv, dk, dv = raw["linear_num_value_heads"], raw["linear_key_head_dim"], raw["linear_value_head_dim"]
    assert qwen35.linear_attn_flops_per_token == 45 * 3 * 2 * nv * dk * dv


def test_weights_are_about_397b(qwen35) -> None:
    # The name's 397B and 17B active; the output gate and the MTP layer (~1%) are not modelled.
    assert 390e9 < qwen35.num_params < 400e9
    assert 16e9 < qwen35.num_active_params < 18e9


@settings(max_examples=40, deadline=None)
@given(seqs=st.integers(1, 512), tp=st.sampled_from([4, 8]))
def test_each_running_sequence_reserves_its_state_beside_the_kv_pool(qwen35, seqs: int, tp: int) -> None:
    hw = get_hardware("B200")
    m = qwen35.with_precision(Precision("bfloat16", "fp8", "fp8"))
    par = Parallelism(tp, expert_parallel_size=tp)
    a = kv_capacity(m, hw, tp, 16, 0.9, 8192, seqs, activation_reserve=0.0, parallel=par)
    b = kv_capacity(m, hw, tp, 16, 0.9, 8192, seqs + 1, activation_reserve=0.0, parallel=par)
    state = m.linear_state_bytes_per_seq_per_gpu(tp)
    assert a.state_bytes == seqs * state
    assert a.usable_bytes - b.usable_bytes == pytest.approx(state)
    assert a.block_bytes == 16 * m.kv_bytes_per_token_per_gpu(tp)  # full-attention layers only


def _roof(m, tp: int = 4) -> RooflineCostModel:
    hw = get_hardware("B200")
    eff = Efficiency.for_hardware(hw, layer_floor_s=0.0, step_overhead_s=0.0, per_seq_overhead_s=0.0)
    return RooflineCostModel(m, hw, tp, eff)


def test_decode_reads_each_state_once_a_step_and_kv_grows_only_with_full_layers(qwen35) -> None:
    roof = _roof(qwen35)
    bw = roof.hardware.mem_bandwidth * roof.eff.memory
    n, c = 64, 64 * 4000
    base = roof.step_time(0, 0, 0, 0.0, n, c)
    grown = roof.step_time(0, 0, 0, 0.0, n, c + 64_000)
    assert grown - base == pytest.approx(64_000 * qwen35.kv_bytes_per_token_per_gpu(4) / bw, rel=1e-6)
    bigger = _roof(replace(qwen35, linear_state_dtype_bytes=8))  # a state twice the float32 ssm part
    ssm = 45 * 64 // 4 * 128 * 128 * 4
    assert bigger.step_time(0, 0, 0, 0.0, n, c) - base == pytest.approx(n * 2 * ssm / bw, rel=1e-6)


def test_prefill_prices_the_recurrence_flops(qwen35) -> None:
    roof = _roof(qwen35)
    peak_a = roof.hardware.peak_flops * roof.eff.attention
    no_state = _roof(replace(qwen35, linear_num_value_heads=0))  # wrong: the recurrence forgotten
    tokens = 8192
    gap = roof.step_time(tokens, 1, 0, 0.0, 0, 0) - no_state.step_time(tokens, 1, 0, 0.0, 0, 0)
    assert gap >= tokens * qwen35.linear_attn_flops_per_token / 4 / peak_a * 0.99


@settings(max_examples=60, deadline=None)
@given(num_seqs=st.integers(1, 512), context=st.integers(0, 2_000_000), max_steps=st.integers(0, 200),
       tp=st.sampled_from([1, 2, 4, 8]))
def test_decode_step_times_equal_generic_loop_for_a_hybrid(qwen35, num_seqs, context, max_steps, tp) -> None:
    class _StepTimeOnly:
        name = "step_time only"

        def __init__(self, model: RooflineCostModel) -> None:
            self.step_time = model.step_time

    roof = RooflineCostModel(qwen35, get_hardware("B200"), tp)
    fast = SimExecutor(roof).decode_step_times(num_seqs, context, max_steps, 0.0, float("inf"))
    slow = SimExecutor(_StepTimeOnly(roof)).decode_step_times(num_seqs, context, max_steps, 0.0, float("inf"))
    assert fast == slow


def test_tp_must_divide_the_linear_heads(qwen35) -> None:
    with pytest.raises(ParallelismError, match="linear-attention key heads"):
        Parallelism(32).check(qwen35)  # 32 divides the 32 attention heads, not the 16 key heads


def test_missing_linear_head_field_names_it(tmp_path, raw) -> None:
    cfg = dict(raw)
    cfg.pop("linear_num_value_heads")
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg, indent=1))
    with pytest.raises(ModelConfigError, match="linear_num_value_heads"):
        load_hf_config(p)


def test_aic_refuses_linear_attention_naming_the_database_tables(qwen35) -> None:
    from twinserve.backends.sim.aic import AicCostModel, AicError
    with pytest.raises(AicError, match="Gated DeltaNet .* gdn_perf"):
        AicCostModel(qwen35, get_hardware("B300"), 4, "sglang")
