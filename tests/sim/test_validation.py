"""The roofline cost model against published measurements, and its physical pieces."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from twinserve.backends.sim import get_hardware, get_model, kv_capacity
from twinserve.backends.sim.capacity import runtime_reserve_bytes
from twinserve.backends.sim.cost_model import Efficiency, RooflineCostModel
from twinserve.backends.sim.engine_profile import ENGINE_PROFILES
from twinserve.backends.sim.validation import MEASUREMENTS, markdown_table, predict

IN_SCOPE = [m for m in MEASUREMENTS if not m.miss]


@pytest.mark.parametrize("m", IN_SCOPE, ids=lambda m: f"{m.model}-{m.hardware}-tp{m.tp}-"
                         f"b{m.batch}-{m.prompt_len}x{m.output_len}-{m.metric}")
def test_published_measurement_within_20_percent(m) -> None:
    assert m.source[1].startswith("https://")
    got = predict(m)
    assert abs(got - m.measured) / m.measured <= 0.20, (got, m.measured)


def test_validation_table_covers_what_capacity_planning_needs() -> None:
    assert len(IN_SCOPE) >= 20
    assert all(m.miss.strip() for m in MEASUREMENTS if m not in IN_SCOPE)  # a miss says why
    assert {m.model for m in IN_SCOPE} >= {"Llama-2-7B", "Llama-2-70B", "Mixtral-8x7B"}
    assert any(m.model.startswith("Llama-3") for m in IN_SCOPE)
    assert any(get_model(m.model).is_moe for m in IN_SCOPE)
    fp8 = [m for m in IN_SCOPE if m.quantization == "fp8"]
    assert {m.hardware for m in fp8} >= {"H100-SXM", "H200"}
    assert {m.hardware for m in IN_SCOPE} >= {"A100-80GB", "H100-SXM", "H200"}
    assert 1 in {m.tp for m in IN_SCOPE} and 8 in {m.tp for m in IN_SCOPE}
    throughput = {"output_tok_s", "output_tok_s_gpu", "in_flight_tok_s"}
    assert throughput & {m.metric for m in IN_SCOPE} and "ttft_ms" in {m.metric for m in IN_SCOPE}
    assert {m.engine for m in MEASUREMENTS} <= set(ENGINE_PROFILES)
    # The docs' table is printed from the same rows: one line per measurement, sources cited.
    table = markdown_table()
    assert sum(line.startswith("| ") and "](" not in line for line in table.splitlines()) == \
        len(MEASUREMENTS) + 1
    assert "https://github.com/NVIDIA/TensorRT-LLM" in table and "cuda_graph_cpp" in table


def test_fp8_rows_would_miss_without_precision() -> None:
    """The FP8 rows hold only because bytes and peaks follow the precision."""
    rows = [m for m in IN_SCOPE if m.quantization == "fp8" and m.metric != "in_flight_tok_s"]
    as_16bit = [dataclasses.replace(m, quantization="none", kv_cache_dtype="auto") for m in rows]
    off = [abs(predict(m) - m.measured) / m.measured > 0.20 for m in as_16bit]
    assert sum(off) >= len(rows) // 2


def test_allreduce_costs_tens_of_microseconds_and_grows_with_tp() -> None:
    eff = Efficiency.for_hardware(get_hardware("A100-80GB"))
    link = get_hardware("A100-80GB").interconnect_bandwidth
    small = [eff.allreduce_time(8192 * 2, tp, link) for tp in (2, 4, 8)]
    assert small == sorted(small)
    assert 30e-6 <= small[1] <= 65e-6 and small[2] <= 65e-6  # measured NCCL on A100: 40-60 us
    big = eff.allreduce_time(2048 * 8192 * 2, 4, link)
    assert big > 4 * small[1]  # a 32 MiB message is bandwidth-bound
    assert eff.allreduce_time(1e6, 1, link) == 0.0


def test_gemm_cost_has_no_knee_and_small_steps_have_a_floor() -> None:
    roof = RooflineCostModel(get_model("Llama-2-7B"), get_hardware("A100-80GB"))
    times = [roof.step_time(n, 1, 0, n * n * 0.5, 0, 0) for n in range(16, 1024, 16)]
    steps = [b - a for a, b in zip(times, times[1:])]
    # Smooth: the cost of 16 more tokens never jumps (a hard knee makes it go 0 -> full).
    assert max(steps) < 1.6 * min(steps)
    assert min(steps) > 0
    tiny = RooflineCostModel(get_model("SmolLM2-135M"), get_hardware("H100-SXM"))
    eff = tiny.eff
    # A 135M model's decode step at batch 1 is launch-bound: at least the per-layer floors.
    floor = 2 * 30 * eff.layer_floor_s + eff.step_overhead_s
    assert tiny.step_time(0, 0, 0, 0.0, 1, 100) >= floor


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    m = get_model("Llama-3-8B")  # 8 KV heads
    assert m.kv_heads_per_gpu(4) == 2
    assert m.kv_heads_per_gpu(8) == m.kv_heads_per_gpu(16) == 1
    assert m.kv_bytes_per_token_per_gpu(16) == m.kv_bytes_per_token_per_gpu(8)
    h = get_hardware("H100-SXM")
    # At TP 16 each GPU still stores one head per token: blocks per GPU grow only by
    # the weight memory freed, never twofold.
    b8 = kv_capacity(m, h, 8, 16).num_blocks
    b16 = kv_capacity(m, h, 16, 16).num_blocks
    assert b8 < b16 < 1.2 * b8


def test_capacity_reserves_cuda_context_nccl_and_graphs() -> None:
    m, h = get_model("Llama-2-70B"), get_hardware("A100-80GB")
    cap = kv_capacity(m, h, 2, 16)
    assert cap.reserved_bytes == runtime_reserve_bytes(h, 2)
    assert runtime_reserve_bytes(h, 2) > runtime_reserve_bytes(h, 1)  # NCCL buffers
    bare = kv_capacity(m, h, 2, 16, runtime_reserve=0.0)
    # 70B at TP 2 has ~7 GiB per GPU left after weights: the reserves cost ~1/5 of it.
    assert 0.12 < 1 - cap.num_blocks / bare.num_blocks < 0.35


def test_the_docs_table_is_printed_from_these_rows() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "capacity.md"
    assert markdown_table() in docs.read_text()
