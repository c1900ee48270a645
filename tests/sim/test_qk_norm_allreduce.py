"""MiniMax-M2's q / k RMSNorm spans the whole projection: under attention TP every layer all-reduces the ranks'
partial variances (vLLM, SGLang). Both cost models price that all-reduce; a per-head norm (Qwen3) has none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from twinserve.backends.sim.aic_models import resolve_row_model
from twinserve.backends.sim.catalog import get_hardware
from twinserve.backends.sim.cost_model import Efficiency, roofline_for
from twinserve.backends.sim.parallel import Parallelism
from twinserve.backends.sim.precision import Precision

MINIMAX = "MiniMaxAI/MiniMax-M2.5"


def minimax(quant: str = "fp8"):
    return resolve_row_model(MINIMAX).with_precision(Precision("bfloat16", quant, "fp8"))


def test_the_config_says_which_norm_spans_the_heads() -> None:
    m = resolve_row_model(MINIMAX)
    assert m.qk_norm and m.qk_norm_across_heads  # config.json: use_qk_norm, qk_norm_type 'per_layer'
    q = resolve_row_model("Qwen/Qwen3-32B")
    assert q.qk_norm and not q.qk_norm_across_heads  # Qwen3 normalises each head: nothing to gather


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_roofline_adds_one_small_all_reduce_a_layer_under_tp(tp: int) -> None:
    hw, m = get_hardware("B200"), minimax()
    eff = Efficiency.for_hardware(hw)
    par = Parallelism(tensor_parallel_size=tp)
    with_ar = roofline_for(m, hw, par, eff).step_time(0, 0, 0, 0.0, 64, 64 * 2000)
    without = roofline_for(replace(m, qk_norm_across_heads=False), hw, par, eff).step_time(0, 0, 0, 0.0, 64,
                                                                                       64 * 2000)
    one = eff.allreduce_time(64 * 8.0, tp, hw.collective_bandwidth(tp))  # 64 rows, two fp32 each
    assert with_ar - without == pytest.approx(m.num_layers * one, rel=1e-9, abs=1e-12)
    assert (with_ar > without) == (tp > 1)


aic = pytest.importorskip("aiconfigurator_core")  # CI installs the [aic] extra


def _aic(model, tp: int, backend: str = "vllm"):
    from twinserve.backends.sim.aic import AicCostModel
    return AicCostModel(model, get_hardware("B200"), tp, backend)


def test_aic_prices_the_all_reduce_as_its_own_table_answers() -> None:
    import aiconfigurator_core.sdk.operations as ops
    from aiconfigurator_core.sdk.engine import build_ops_json

    from twinserve.backends.sim.aic.graph import QK_NORM_AR_MIN_TOKENS
    m = minimax()
    c, plain = _aic(m, 4), _aic(replace(m, qk_norm_across_heads=False), 4)
    assert "qk_norm_allreduce" in c.graph.names and "qk_norm_allreduce" not in plain.graph.names
    js = build_ops_json([ops.CustomAllReduce("q", m.num_layers, 4, 4)])  # 4 bf16 elements = two fp32 a token

    def table(x: int) -> float:
        return sum(r[1] for r in c._eval(js, is_context=True, batch_size=1, s=1, x=x)) * 1e-3

    for rows in (1, 8, 32, 128, 1024):
        extra = c.decode_tokens_time(rows) - plain.decode_tokens_time(rows)
        assert extra == pytest.approx(table(max(rows, QK_NORM_AR_MIN_TOKENS)), rel=1e-9)
        assert c.tokens_time(rows) - plain.tokens_time(rows) == pytest.approx(extra, rel=1e-9)
    # Below the table's smallest message aic's lookup runs towards zero; the price keeps the latency floor.
    assert table(1) < 0.1 * table(QK_NORM_AR_MIN_TOKENS)
    assert c.qk_norm_time(1) == c.qk_norm_time(QK_NORM_AR_MIN_TOKENS) > 0


def test_aic_has_no_such_all_reduce_at_tp1_or_on_trtllm() -> None:
    m = minimax()
    assert _aic(m, 1).qk_norm_time(256) == 0.0
    assert "qk_norm_allreduce" not in _aic(m, 1).graph.names
    trt = _aic(m, 4, "trtllm")  # aic's B200 TensorRT-LLM tables price MiniMax-M2.5: no skip to hide behind
    assert "qk_norm_allreduce" not in trt.graph.names and trt.qk_norm_time(256) == 0.0
