"""Prefill attention on FP8 K/V where aic's database measured the shape only with an FP8 FMHA: priced
there, not refused; a shape the 16-bit-FMHA lane holds keeps that lane."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

from twinserve.backends.sim.aic import AicCostModel  # noqa: E402
from twinserve.backends.sim.aic_models import resolve_row_model  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_FP8 = Precision("bfloat16", "fp8", "fp8")


def _fmha(c: AicCostModel) -> set[str]:
    return {f["fmha_quant_mode"] for op in json.loads(c.graph.context_attn) for f in op.values()}


@pytest.mark.parametrize("path,tp", [("Qwen/Qwen3-235B-A22B-FP8", 4), ("nvidia/Llama-3.1-8B-Instruct-FP8", 1)])
def test_sglang_hopper_fp8_kv_prefill_takes_the_fp8_fmha_lane(path: str, tp: int) -> None:
    """These were the 42 held-out SGLang H200 rows that failed with 'no context attention timings'."""
    m = resolve_row_model(path).with_precision(_FP8)
    c = AicCostModel(m, get_hardware("H200"), tp=tp, backend="sglang")
    assert _fmha(c) == {"fp8"}
    assert c.context_attention_time(1, 2048, 0) > c.context_attention_time(1, 512, 0) > 0


def test_a_shape_the_16_bit_lane_holds_keeps_it() -> None:
    m = resolve_row_model("Qwen/Qwen3-235B-A22B-FP8").with_precision(_FP8)
    assert _fmha(AicCostModel(m, get_hardware("H200"), tp=4, backend="vllm")) == {"bfloat16"}
    bf16_kv = m.with_precision(Precision("bfloat16", "fp8", "auto"))
    assert _fmha(AicCostModel(bf16_kv, get_hardware("H200"), tp=4, backend="sglang")) == {"bfloat16"}
