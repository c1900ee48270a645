"""TensorRT-LLM's TRTLLM MoE backend for FP8 block-scaled experts on the measured backend: the experts priced
from aic's SGLang 0.5.14 rows of FlashInfer's trtllm-gen block-scale MoE (backends/sim/aic/trtgen.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

from twinserve.backends.sim.aic import AicCostModel, AicError  # noqa: E402
from twinserve.backends.sim.aic.trtgen import trtgen_moe  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_MODELS: dict[tuple, AicCostModel] = {}


def dsr1(kernel: str, quant: str = "fp8", backend: str = "trtllm", tp: int = 8) -> AicCostModel:
    key = (kernel, quant, backend, tp)
    if key not in _MODELS:
        m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", quant, "fp8"))
        _MODELS[key] = AicCostModel(m, get_hardware("B200"), backend=backend, parallel=Parallelism(tp, 1, 1, 1),
                                    fp8_moe_kernel=kernel)
    return _MODELS[key]


def test_the_fp8_expert_op_is_found_with_its_layers() -> None:
    t = trtgen_moe(dsr1("trtllm").graph.tokens)
    assert t is not None and t.layers == 58  # DeepSeek-R1: 61 layers, the first 3 dense
    (fields,) = (e["Moe"] for e in json.loads(t.op))
    assert fields["quant_mode"] == "fp8_block" and fields["scale_factor"] == 1.0
    assert trtgen_moe(dsr1("default", quant="nvfp4").graph.tokens) is None


@pytest.mark.parametrize("rows", [4, 16, 64])
def test_trtllm_experts_replace_deepgemms_price_in_decode_and_prefill_steps(rows: int) -> None:
    default, gen = dsr1("default"), dsr1("trtllm")
    # aic's SGLang 0.5.14 B200 rows of `sglang_flashinfer_trtllm_moe` fp8_block, DeepSeek-R1's experts at MoE
    # TP 8, power law 1.01 (ms a layer): 4 tokens 0.0497, 16: 0.1022, 64: 0.1810; TensorRT-LLM 1.3.0rc20's
    # DeepGEMM rows there: 0.133, 0.220, 0.349. The step falls by 58 layers x the difference.
    sgl = {4: 0.049692, 16: 0.102150, 64: 0.180974}[rows]
    own = sum(r[1] for r in default._eval(trtgen_moe(default.graph.tokens).op, is_context=True, batch_size=1,
                                          s=1, x=rows))
    assert gen.trtgen_time(rows) == pytest.approx(58 * (sgl - own) * 1e-3, rel=1e-4)
    assert gen.decode_tokens_time(rows) - default.decode_tokens_time(rows) == pytest.approx(
        gen.trtgen_time(rows), rel=1e-9)
    assert gen.tokens_time(rows) - default.tokens_time(rows) == pytest.approx(gen.trtgen_time(rows), rel=1e-9)
    assert gen.decode_tokens_time(rows) < 0.7 * default.decode_tokens_time(rows)
    assert "trtllm-gen" in gen.describe() and "trtllm-gen" not in default.describe()


def test_the_kernel_is_refused_where_it_does_not_apply() -> None:
    with pytest.raises(AicError, match="aic_fp8_moe_kernel"):
        dsr1("trtllm", backend="sglang")  # TensorRT-LLM's backend only
    with pytest.raises(AicError, match="not one of"):
        dsr1("deepgemm")


@pytest.mark.parametrize("rows", [16, 256])
def test_what_the_trtllm_experts_change_is_all_in_the_experts_share(rows: int) -> None:
    # An attention-DP step takes the experts' share out at one rank's tokens and puts it back at the step's
    # (AicCostModel._busiest_rank_time): a kernel delta left outside expert_time was kept at the wrong count.
    base, tg = dsr1("default"), dsr1("trtllm")
    assert tg.expert_time(rows) - base.expert_time(rows) == pytest.approx(
        tg.tokens_time(rows) - base.tokens_time(rows), rel=1e-9, abs=1e-12)
    assert tg.expert_time(rows) != base.expert_time(rows)


def test_nvfp4_trtllm_experts_read_aics_trtllm_gen_rows_above_128_tokens_only() -> None:
    # aic's TensorRT-LLM 1.3.0rc20 B200 table, DeepSeek-R1's NVFP4 experts at MoE TP 8 (power law 1.01, ms a
    # layer): trtllm-gen (`moe_torch_flow_min_latency`) 128 / 256 / 1024 tokens 0.128 / 0.158 / 0.191; CUTLASS
    # 0.269 / 0.294 / 0.397. aic's own answer is trtllm-gen's up to 128 tokens and CUTLASS's above.
    default, gen = dsr1("default", quant="nvfp4"), dsr1("trtllm", quant="nvfp4")
    assert "trtllm-gen NVFP4" in gen.describe()
    for rows in (4, 16, 64, 128):
        assert gen.trtgen_time(rows) == 0.0
        assert gen.decode_tokens_time(rows) == default.decode_tokens_time(rows)
    moe = trtgen_moe(default.graph.tokens, "nvfp4")
    for rows, trtgen in ((256, 0.158), (1024, 0.191)):
        own = sum(r[1] for r in default._eval(moe.op, is_context=True, batch_size=1, s=1, x=rows))
        assert own > 1.5 * trtgen  # aic's own answer there: the CUTLASS row
        assert gen.trtgen_time(rows) == pytest.approx(58 * (trtgen - own) * 1e-3, abs=58 * 0.0006e-3)
        assert gen.tokens_time(rows) - default.tokens_time(rows) == pytest.approx(gen.trtgen_time(rows), rel=1e-9)
    # between two of the table's points: linear in the token count
    mid = gen._trtgen_eval.latency_ms(640)
    assert mid == pytest.approx((gen._trtgen_eval.latency_ms(512) + gen._trtgen_eval.latency_ms(768)) / 2, rel=1e-9)
