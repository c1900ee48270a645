"""vLLM's Triton fused-MoE for FP8 block-scaled experts on the measured backend (`aic_fp8_moe_kernel` 'triton'): the
experts priced from aic's vLLM 0.19.0 B200 rows of that kernel (backends/sim/aic/vllm_triton.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

from twinserve.backends.sim.aic import AicCostModel, AicError  # noqa: E402
from twinserve.backends.sim.aic.trtgen import trtgen_moe  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_MODELS: dict[tuple, AicCostModel] = {}


def minimax(kernel: str, gpu: str = "B200", backend: str = "vllm", tp: int = 2, ep: int = 2) -> AicCostModel:
    key = (kernel, gpu, backend, tp, ep)
    if key not in _MODELS:
        m = resolve_row_model("MiniMaxAI/MiniMax-M2.5").with_precision(Precision("bfloat16", "fp8", "auto"))
        _MODELS[key] = AicCostModel(m, get_hardware(gpu), backend=backend, parallel=Parallelism(tp, 1, ep, 1),
                                    fp8_moe_kernel=kernel)
    return _MODELS[key]


def _table(version: str, source: str, tokens: int, ep: int) -> float:
    """One layer's ms of MiniMax-M2.5's block-FP8 experts (hidden 3072, intermediate 1536, 256 experts, top 8) in
    aic's B200 vLLM table of `version`, MoE TP 1 x EP `ep`, the model's power-law 1.2 routing, read from the file."""
    import aiconfigurator_core
    d = pd.read_parquet(Path(aiconfigurator_core.__file__).parent / "systems/data/b200_sxm/moe/vllm" / version
                        / "moe_perf.parquet")
    d = d[(d.kernel_source == source) & (d.moe_dtype == "fp8_block") & (d.hidden_size == 3072)
          & (d.inter_size == 1536) & (d.topk == 8) & (d.num_experts == 256) & (d.moe_tp_size == 1)
          & (d.moe_ep_size == ep) & (d.distribution == "power_law_1.2") & (d.num_tokens == tokens)]
    (ms,) = d.latency
    return float(ms)


@pytest.mark.parametrize("rows, ep", [(8, 2), (128, 2), (1024, 4)])
def test_triton_experts_replace_flashinfer_trtllms_price_by_the_0190_triton_rows(rows: int, ep: int) -> None:
    # The model's own table (vLLM 0.24.0) answers from FlashInfer TRTLLM rows; 'triton' moves each of the 62 MoE
    # layers to aic's vLLM 0.19.0 `vllm_fused_moe` row of the same op (Triton is 1.3-2x slower at these counts).
    default, triton = minimax("default", ep=ep, tp=ep), minimax("triton", ep=ep, tp=ep)
    t = trtgen_moe(default.graph.tokens)
    assert t is not None and t.layers == 62
    own = _table("0.24.0", "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic", rows, ep)
    fused = _table("0.19.0", "vllm_fused_moe", rows, ep)
    assert fused > 1.2 * own
    assert triton.trtgen_time(rows) == pytest.approx(62 * (fused - own) * 1e-3, rel=1e-4)
    assert triton.decode_tokens_time(rows) - default.decode_tokens_time(rows) == pytest.approx(
        triton.trtgen_time(rows), rel=1e-9)
    assert triton.tokens_time(rows) - default.tokens_time(rows) == pytest.approx(triton.trtgen_time(rows), rel=1e-9)
    assert triton.expert_time(rows) - default.expert_time(rows) == pytest.approx(triton.trtgen_time(rows), rel=1e-9)
    assert default.trtgen_time(rows) == 0.0
    assert "vLLM Triton FP8 experts from aic vllm 0.19.0" in triton.describe()
    assert "Triton" not in default.describe()


@pytest.mark.parametrize("gpu, backend, why", [
    ("B200", "sglang", "on aic_backend 'sglang' has none"),  # vLLM's kernel
    ("B300", "vllm", "b200_sxm only, not b300_sxm"),  # no aic table of it
    ("H200", "vllm", "b200_sxm only, not h200_sxm"),
])
def test_the_triton_kernel_is_refused_where_it_does_not_apply(gpu: str, backend: str, why: str) -> None:
    with pytest.raises(AicError, match="aic_fp8_moe_kernel 'triton'") as err:
        minimax("triton", gpu=gpu, backend=backend)
    assert why in str(err.value) and err.value.field == "aic_fp8_moe_kernel"


def test_the_triton_kernel_is_refused_for_experts_that_are_not_block_fp8() -> None:
    m = resolve_row_model("MiniMaxAI/MiniMax-M2.5").with_precision(Precision("bfloat16", "none", "auto"))
    with pytest.raises(AicError, match="has none"):
        AicCostModel(m, get_hardware("B200"), backend="vllm", parallel=Parallelism(2, 1, 2, 1),
                     fp8_moe_kernel="triton")
