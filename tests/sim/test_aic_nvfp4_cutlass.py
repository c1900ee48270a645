"""TensorRT-LLM's CUTLASS MoE backend on NVFP4 experts (`aic_nvfp4_moe_kernel` 'cutlass'): the experts priced on aic's
CUTLASS NVFP4 rows at every gathered token count (aic's own choice prices trtllm-gen's rows up to 128), B200's from
aic's GB200 TensorRT-LLM table (backends/sim/aic/trtgen.py); and the InferenceX recipes that set CUTLASS."""

from __future__ import annotations

import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

from twinserve.backends.sim.aic import AicCostModel, AicError  # noqa: E402
from twinserve.backends.sim.aic.trtgen import NVFP4_CUTLASS_SOURCE, nvfp4_trtgen_points, trtgen_moe  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402
from twinserve.sim.validate_recipes import (  # noqa: E402
    _dsr1_b200_trt_mtp, _dsr1_fp4_b200_trt, _dsr1_fp4_b200_trt_rc6, _dsr1_fp8_b200_trt_mtp_rc6)

_MODELS: dict[tuple, AicCostModel] = {}


def dsr1(kernel: str = "default", quant: str = "nvfp4", adp: int = 8, hw: str = "B200", backend: str = "trtllm",
         fp8_kernel: str = "default") -> AicCostModel:
    key = (kernel, quant, adp, hw, backend, fp8_kernel)
    if key not in _MODELS:
        m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", quant, "fp8"))
        # attention DP `adp` ranks, experts EP = adp (the FP4 "tp1 adpN epN" rows)
        _MODELS[key] = AicCostModel(m, get_hardware(hw), backend=backend, parallel=Parallelism(1, adp, adp, 1),
                                    nvfp4_moe_kernel=kernel, fp8_moe_kernel=fp8_kernel)
    return _MODELS[key]


def _layer_ms(cm: AicCostModel, rank_rows: int, ev=None) -> float:
    moe = trtgen_moe(cm.graph.tokens, "nvfp4")
    return sum(r[1] for r in (ev or cm._eval)(moe.op, is_context=True, batch_size=1, s=1, x=rank_rows))


def test_cutlass_experts_read_gb200s_cutlass_rows_at_every_gathered_count() -> None:
    # aic 1.3.0rc20 TensorRT-LLM tables, DeepSeek-R1 NVFP4 experts at MoE TP 1 / EP 8, power law 1.01, ms a layer:
    # GB200 CUTLASS 128 / 256 / 512 gathered tokens 0.139 / 0.151 / 0.170; B200's own answer trtllm-gen's 0.123 up
    # to 128, then B200's CUTLASS rows 0.291 / 0.274.
    default, cut = dsr1(), dsr1("cutlass")
    assert "CUTLASS NVFP4 experts from aic's gb200 CUTLASS rows" in cut.describe()
    for rank_rows, gb200, own in ((16, 0.139, 0.123), (32, 0.151, 0.291), (64, 0.170, 0.274)):
        assert _layer_ms(default, rank_rows) == pytest.approx(own, abs=0.0015)
        assert _layer_ms(cut, rank_rows, cut._trtgen_eval) == pytest.approx(gb200, abs=0.0015)
        assert cut.trtgen_time(rank_rows) == pytest.approx(58 * (gb200 - own) * 1e-3, abs=58 * 0.003e-3)
        assert cut.tokens_time(rank_rows) - default.tokens_time(rank_rows) == pytest.approx(
            cut.trtgen_time(rank_rows), rel=1e-9)
    # a few gathered tokens: still CUTLASS (GB200 0.093 ms at 16), not aic's trtllm-gen answer (0.084 on B200)
    assert cut.trtgen_time(2) > 0.0
    pts = dict(nvfp4_trtgen_points(default.database, trtgen_moe(default.graph.tokens, "nvfp4"),
                                   NVFP4_CUTLASS_SOURCE, "gb200"))
    assert cut._trtgen_eval.latency_ms(16) == pytest.approx(pts[16], rel=1e-9)


def test_cutlass_on_gb200_reads_its_own_table() -> None:
    cut = dsr1("cutlass", hw="GB200", adp=4)
    assert "from aic's own CUTLASS rows" in cut.describe()
    assert cut._trtgen_eval.latency_ms(128) == pytest.approx(0.239, abs=0.0015)  # GB200 EP 4, 128 tokens


def test_cutlass_is_refused_where_it_does_not_apply() -> None:
    with pytest.raises(AicError, match="aic_nvfp4_moe_kernel"):
        dsr1("cutlass", quant="fp8")  # no NVFP4 experts
    with pytest.raises(AicError, match="aic_nvfp4_moe_kernel"):
        dsr1("cutlass", backend="sglang")
    with pytest.raises(AicError, match="not one of"):
        dsr1("deepgemm")
    with pytest.raises(AicError, match="set one"):
        dsr1("cutlass", fp8_kernel="trtllm")


def test_the_b200_fp4_scripts_cutlass_is_carried() -> None:
    # benchmarks/dsr1_fp4_b200_trt.sh @6320e9b: CUTLASS from 256 clients at 1k/1k and 1k/8k, above 32 at 8k/1k
    assert _dsr1_fp4_b200_trt(1024, 1024, 256, 8).nvfp4_moe_kernel == "cutlass"
    assert _dsr1_fp4_b200_trt(1024, 8192, 128, 4).nvfp4_moe_kernel == ""
    assert _dsr1_fp4_b200_trt(8192, 1024, 64, 8).nvfp4_moe_kernel == "cutlass"
    assert _dsr1_fp4_b200_trt(8192, 1024, 32, 8).nvfp4_moe_kernel == ""
    # the 1.2.0rc6 scripts and the MTP one: CUTLASS under attention DP, TRTLLM without
    assert _dsr1_fp4_b200_trt_rc6(1024, 1024, 256, 8, True).nvfp4_moe_kernel == "cutlass"
    assert _dsr1_fp4_b200_trt_rc6(1024, 1024, 256, 8, False).nvfp4_moe_kernel == ""
    mtp_adp, mtp_tp = _dsr1_b200_trt_mtp(1024, 1024, 64, 8, True), _dsr1_b200_trt_mtp(1024, 1024, 64, 8, False)
    assert (mtp_adp.nvfp4_moe_kernel, mtp_adp.fp8_moe_kernel) == ("cutlass", "")
    assert (mtp_tp.nvfp4_moe_kernel, mtp_tp.fp8_moe_kernel) == ("", "trtllm")
    assert _dsr1_fp8_b200_trt_mtp_rc6(1024, 1024, 64, 8, True).nvfp4_moe_kernel == ""  # FP8: DEEPGEMM
