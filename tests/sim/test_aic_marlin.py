"""vLLM's Marlin MXFP4 experts (VLLM_MXFP4_USE_MARLIN=1) on the measured backend: gpt-oss's experts priced
from aic's Marlin MXFP4 MoE rows (Kimi-K3's shape) at the same rows per expert (backends/sim/aic/marlin.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

import aiconfigurator_core.sdk.operations as ops  # noqa: E402
from aiconfigurator_core.sdk import common  # noqa: E402
from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json  # noqa: E402

from twinserve.backends.sim.aic import AicCostModel, AicError  # noqa: E402
from twinserve.backends.sim.aic.marlin import marlin_moe  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_MODELS: dict[tuple, AicCostModel] = {}


def gpt_oss(hw: str, tp: int, kernel: str, backend: str = "vllm") -> AicCostModel:
    key = (hw, tp, kernel, backend)
    if key not in _MODELS:
        m = resolve_row_model("openai/gpt-oss-120b").with_precision(Precision("bfloat16", "mxfp4", "auto"))
        _MODELS[key] = AicCostModel(m, get_hardware(hw), backend=backend, parallel=Parallelism(tp, 1, 1, 1),
                                    mxfp4_moe_kernel=kernel)
    return _MODELS[key]


def test_the_transfer_matches_rows_per_expert_and_scales_by_expert_work() -> None:
    c = gpt_oss("H200", 2, "marlin")
    t = marlin_moe(c.graph.tokens)
    assert t is not None and t.layers == 36
    # gpt-oss routes 4 of 128 experts, Kimi-K3 16 of 896: the same rows per expert at 1.75x the tokens.
    assert t.token_ratio == pytest.approx((4 / 128) / (16 / 896))
    assert t.reference_tokens(4096) == 7168
    # vLLM's Marlin pads gpt-oss's shards: hidden 2880 -> 3072, 1440 a shard at TP 2 -> 1536 (mxfp4.py).
    assert t.work_ratio == pytest.approx(128 * 3072 * 1536 / (896 * 3584 * 1536))
    assert marlin_moe(gpt_oss("H200", 1, "marlin").graph.tokens).work_ratio == pytest.approx(
        128 * 3072 * 2944 / (896 * 3584 * 3072))


@pytest.mark.parametrize("hw, tp", [("H200", 1), ("H200", 2), ("H100-SXM", 4), ("H200", 8)])
def test_marlin_prices_prefill_steps_from_aics_marlin_rows_and_keeps_decode_steps(hw: str, tp: int) -> None:
    default, marlin = gpt_oss(hw, tp, "default"), gpt_oss(hw, tp, "marlin")
    # Decode-sized steps: the model's own table is the larger price, the same float.
    for rows in (1, 8):
        assert marlin.decode_tokens_time(rows) == default.decode_tokens_time(rows)
    # A prefill step of 8,192 tokens: aic's Marlin rows at the same rows per expert, independently queried.
    m, tokens = marlin.model, 8192
    ref = ops.MoE("ref", 1, 3584, 3072, 16, 896, tp, 1, common.MoEQuantMode.w4a16_mxfp4, "power_law_1.2", 1)
    own = ops.MoE("own", 1, m.hidden_size, m.moe_intermediate_size, 4, 128, tp, 1,
                  common.MoEQuantMode.w4a16_mxfp4, "power_law_1.2", 1)
    ev = EngineHandle.for_database(marlin.database).evaluate_ops_json
    ref_ms = ev(build_ops_json([ref]), is_context=True, batch_size=1, s=1, x=round(tokens * 1.75))[0][1]
    own_ms = ev(build_ops_json([own]), is_context=True, batch_size=1, s=1, x=tokens)[0][1]
    padded = {1: 2944, 2: 1536, 4: 768, 8: 384}[tp]  # 2880 / tp up to a multiple of 128
    ratio = 128 * 3072 * padded / (896 * 3584 * (3072 // tp))
    extra = 36 * (ref_ms * ratio - own_ms) * 1e-3
    assert extra > 0.0
    assert marlin.tokens_time(tokens) - default.tokens_time(tokens) == pytest.approx(extra, rel=1e-9)
    # Marlin's prefill is the slower one on Hopper: the step costs over 1.3x the Triton table's.
    assert marlin.tokens_time(tokens) > 1.3 * default.tokens_time(tokens)
    assert "Marlin" in marlin.describe() and "Marlin" not in default.describe()


def test_marlin_is_refused_where_it_is_not_vllms_mxfp4_kernel() -> None:
    with pytest.raises(AicError, match="aic_mxfp4_moe_kernel 'marlin'"):
        gpt_oss("H200", 2, "marlin", backend="trtllm")
    with pytest.raises(AicError, match="not one of"):
        gpt_oss("H200", 2, "cutlass")
    llama = resolve_row_model("meta-llama/Llama-3.1-70B")
    with pytest.raises(AicError, match="has none"):
        AicCostModel(llama, get_hardware("H200"), tp=4, backend="vllm", mxfp4_moe_kernel="marlin")
