"""TensorRT-LLM's NVFP4 dense GEMMs priced as its autotuner runs them: each at the lower of aic's TensorRT-LLM
answer (the untuned fallback) and aic's SGLang 0.5.14 NVFP4 row (backends/sim/aic/nvfp4_gemm.py)."""

from __future__ import annotations

import json
from unittest import mock

import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

from twinserve.backends.sim.aic import AicCostModel  # noqa: E402
from twinserve.backends.sim.aic.nvfp4_gemm import nvfp4_gemm_ops  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_MODELS: dict[tuple, AicCostModel] = {}


def llama(backend: str = "trtllm", quant: str = "nvfp4", tp: int = 8) -> AicCostModel:
    key = (backend, quant, tp)
    if key not in _MODELS:
        m = resolve_row_model("meta-llama/Meta-Llama-3.1-70B").with_precision(Precision("bfloat16", quant, "fp8"))
        _MODELS[key] = AicCostModel(m, get_hardware("B200"), backend=backend, parallel=Parallelism(tp, 1, 1, 1))
    return _MODELS[key]


def _own_ms(c: AicCostModel, graph: str, rows: int) -> float:
    return sum(r[1] for r in c._eval(graph, is_context=True, batch_size=1, s=1, x=rows))


def test_decode_gemms_are_priced_at_the_stand_in_rows() -> None:
    c = llama()
    assert "NVFP4 GEMMs tuned" in c.describe()
    # aic's B200 gemm tables at M = 4, Llama-3.1-70B at TP 8 (ms a layer): TensorRT-LLM 1.3.0rc20 nvfp4
    # (torch_flow) against SGLang 0.5.14 nvfp4 (sglang_flashinfer_cutedsl_nvfp4):
    # proj 8192 x 1024 0.00837 / 0.00506, gate-up 7168 x 8192 0.02225 / 0.01259, down 8192 x 3584 0.01311 / 0.00794.
    # The QKV GEMM (1280 x 8192) falls between the tables' grid points: both answers are aic's.
    fp4 = json.loads(c._fp4[1])
    assert [o["Gemm"]["name"] for o in fp4] == ["qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm"]
    qkv = json.dumps(fp4[:1])
    own_qkv = c._eval(qkv, is_context=True, batch_size=1, s=1, x=4)[0][1]
    sgl_qkv = c._fp4_eval(qkv, is_context=True, batch_size=1, s=1, x=4)[0][1]
    assert sgl_qkv < own_qkv
    grid = 80 * ((0.005063 - 0.008366) + (0.012589 - 0.022250) + (0.007935 - 0.013108))
    assert c.nvfp4_gemm_time(4, decode=True) == pytest.approx((grid + sgl_qkv - own_qkv) * 1e-3, rel=1e-3)
    # The whole difference lands in the decode step's linear layers, nowhere else.
    assert c.decode_tokens_time(4) == pytest.approx(
        _own_ms(c, c.graph.decode_tokens, 4) * 1e-3 + c.nvfp4_gemm_time(4, decode=True), rel=1e-12)
    assert c.decode_tokens_time(4) < 0.7 * _own_ms(c, c.graph.decode_tokens, 4) * 1e-3


def test_an_op_the_stand_in_prices_higher_keeps_aics_answer() -> None:
    # At 4,096 rows the SGLang row of the 8192 x 1024 output projection is the slower one: the tuner would keep
    # the fallback it already has, so that op's price does not move; the others still fall.
    c = llama()
    ops = c._fp4[0]
    own = c._eval(ops, is_context=True, batch_size=1, s=1, x=4096)
    sgl = c._fp4_eval(ops, is_context=True, batch_size=1, s=1, x=4096)
    by = {a[0]: (a[1], b[1]) for a, b in zip(own, sgl)}
    assert by["proj_gemm"][1] > by["proj_gemm"][0]
    want = sum(min(0.0, s - o) for o, s in by.values())
    assert c.nvfp4_gemm_time(4096, decode=False) == pytest.approx(want * 1e-3, rel=1e-12)
    assert want < sum(s - o for o, s in by.values())  # the slower stand-in row is not taken
    for rows in (1, 8, 64, 512, 4096):
        assert c.nvfp4_gemm_time(rows, decode=False) <= 0.0
        assert c.tokens_time(rows) == pytest.approx(
            _own_ms(c, c.graph.tokens, rows) * 1e-3 + c.nvfp4_gemm_time(rows, decode=False), rel=1e-12)


@pytest.mark.parametrize("backend, quant", [("sglang", "nvfp4"), ("vllm", "nvfp4"), ("trtllm", "fp8")])
def test_other_engines_and_precisions_keep_aics_answer(backend: str, quant: str) -> None:
    c = llama(backend, quant, tp=4)
    assert "NVFP4 GEMMs tuned" not in c.describe()
    for rows in (4, 256):
        assert c.nvfp4_gemm_time(rows, decode=True) == 0.0
        assert c.decode_tokens_time(rows) == pytest.approx(_own_ms(c, c.graph.decode_tokens, rows) * 1e-3,
                                                           rel=1e-12)


def test_without_stand_in_rows_aics_answer_stands() -> None:
    with mock.patch("twinserve.backends.sim.aic.cost_model.NVFP4_GEMM_DATABASE", ("sglang", "0.0.0")):
        m = resolve_row_model("meta-llama/Meta-Llama-3.1-70B").with_precision(Precision("bfloat16", "nvfp4", "fp8"))
        c = AicCostModel(m, get_hardware("B200"), backend="trtllm", parallel=Parallelism(2, 1, 1, 1))
    assert "NVFP4 GEMMs tuned" not in c.describe()
    assert c.decode_tokens_time(8) == pytest.approx(_own_ms(c, c.graph.decode_tokens, 8) * 1e-3, rel=1e-12)


def test_gemms_inside_an_overlap_group_are_left_to_aic() -> None:
    def gemm(name: str, quant: str = "nvfp4") -> dict:
        return {"Gemm": {"name": name, "scale_factor": 1.0, "n": 256, "k": 256, "quant_mode": quant}}
    graph = json.dumps([gemm("a"), gemm("b", "bfloat16"),
                        {"Overlap": {"name": "o", "group_a": [gemm("shared")], "group_b": []}}, gemm("c")])
    assert [o["Gemm"]["name"] for o in json.loads(nvfp4_gemm_ops(graph))] == ["a", "c"]
    assert nvfp4_gemm_ops(json.dumps([gemm("b", "fp8")])) == ""
