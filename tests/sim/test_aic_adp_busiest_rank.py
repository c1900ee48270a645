"""An attention-DP step with prefill is priced on its busiest rank: whole requests a rank, lock step
(backends/sim/aic/cost_model.py AicCostModel._busiest_rank_time)."""

from __future__ import annotations

import pytest

pytest.importorskip("aiconfigurator_core")  # only when the [aic] extra is not installed; CI installs it

from twinserve.backends.sim.aic import AicCostModel  # noqa: E402
from twinserve.backends.sim.catalog import get_hardware  # noqa: E402
from twinserve.backends.sim.parallel import Parallelism  # noqa: E402
from twinserve.backends.sim.precision import Precision  # noqa: E402

_CACHE: dict[int, AicCostModel] = {}


def _dep(dp: int) -> AicCostModel:
    """DeepSeek-R1 FP4 on B200 under SGLang, attention TP 1 x DP dp, experts over dp ranks (the B200 FP4
    disaggregated rows' prefill worker at dp 4)."""
    if dp not in _CACHE:
        from twinserve.backends.sim.aic_models import resolve_row_model
        m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "nvfp4", "fp8"))
        _CACHE[dp] = AicCostModel(m, get_hardware("B200"), backend="sglang", parallel=Parallelism(1, dp, dp, 1))
    return _CACHE[dp]


def test_one_long_prompt_costs_more_than_the_same_tokens_spread_over_the_ranks() -> None:
    c = _dep(4)
    one = c.step_time(8192, 1, 0, 0.0, 0, 0)      # one 8k prompt: all of it on one rank
    four = c.step_time(8192, 4, 0, 0.0, 0, 0)     # four 2k prompts: one on each rank
    # Spread as 1/4 of every feature (before), both were the same 2k-token chunk a rank.
    assert one > 1.5 * four
    # The lone prompt's rank runs what a lone rank runs for it; only the experts see the step's total.
    rank = c.stage_time(8192, 1, 0, 0, 0) - c.expert_time(8192) + c.expert_time(2048)
    assert one == pytest.approx(rank * c.kernel_scale + c.step_overhead_s + c.per_seq_overhead_s, rel=1e-12)


def test_the_experts_keep_the_steps_total_tokens() -> None:
    c = _dep(4)
    assert 0 < c.expert_time(2048) < c.expert_time(8192)
    # The busiest rank's price is below pricing every rank as busy (experts at 4 x 8k tokens).
    assert c.step_time(8192, 1, 0, 0.0, 0, 0) < c.stage_time(8192, 1, 0, 0, 0)


def test_balanced_steps_and_decode_steps_are_priced_as_before() -> None:
    c = _dep(4)
    # Four equal prompts, one a rank: the busiest rank is any rank (the even share).
    assert c.step_time(8192, 4, 4 * 1000, 0.0, 0, 0) == pytest.approx(c.stage_time(2048, 1, 1000, 0, 0), rel=1e-12)
    # Decode rows are whole already: ceil(rows / dp) a rank, unchanged.
    assert c.step_time(0, 0, 0, 0.0, 64, 64 * 2000) == pytest.approx(c.stage_time(0, 0, 0, 16, 16 * 2000), rel=1e-12)


def test_without_attention_dp_nothing_changes() -> None:
    c = _dep(1)
    assert c.step_time(8192, 1, 0, 0.0, 3, 3000) == pytest.approx(c.stage_time(8192, 1, 0, 3, 3000), rel=1e-12)


def test_the_roofline_prices_the_busiest_rank_too() -> None:
    from twinserve.backends.sim.cost_model import RooflineCostModel
    from twinserve.backends.sim.aic_models import resolve_row_model
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "nvfp4", "fp8"))
    c = RooflineCostModel(m, get_hardware("B200"), 1, parallel=Parallelism(1, 4, 4, 1))
    one = c.step_time(8192, 1, 0, 8192 * 8193 / 2, 0, 0)
    four = c.step_time(8192, 4, 0, 4 * 2048 * 2049 / 2, 0, 0)
    assert one > 2.5 * four  # 1.5x before: the 1/4-share attention of the long prompt only


def test_host_time_counts_one_ranks_sequences() -> None:
    """Each attention-DP rank schedules its own requests at once with the others: a step's per-sequence
    host time is the busiest rank's, not every rank's (41 ms on a 4,096-row step over 32 ranks before)."""
    from twinserve.backends.sim.aic_models import resolve_row_model
    m = resolve_row_model("deepseek-ai/DeepSeek-R1").with_precision(Precision("bfloat16", "nvfp4", "fp8"))
    c = AicCostModel(m, get_hardware("B200"), backend="sglang", parallel=Parallelism(1, 4, 4, 1),
                     step_overhead_s=1e-3, per_seq_overhead_s=1e-5)
    decode = c.step_time(0, 0, 0, 0.0, 4096, 4096 * 2000)
    kernels = c.stage_time(0, 0, 0, 1024, 1024 * 2000) * c.kernel_scale
    assert decode - kernels == pytest.approx(1e-3 + 1024 * 1e-5, rel=1e-9)
    # With prefill: 5 prompts over 4 ranks put 2 on the busiest, 10 decode rows 3: 5 sequences of host time.
    mixed = c.step_time(5 * 512, 5, 0, 0.0, 10, 10 * 2000)
    busiest = c._busiest_rank_time(5 * 512, 5, 0, 10, 10 * 2000, 4)[0] * c.kernel_scale
    assert mixed - busiest == pytest.approx(1e-3 + 5 * 1e-5, rel=1e-9)
    # One rank: every sequence is its own scheduler's.
    one = AicCostModel(m, get_hardware("B200"), backend="sglang", parallel=Parallelism(4, 1, 4, 1),
                       step_overhead_s=1e-3, per_seq_overhead_s=1e-5)
    assert (one.step_time(0, 0, 0, 0.0, 64, 64 * 2000) - one.stage_time(0, 0, 0, 64, 64 * 2000) * one.kernel_scale
            == pytest.approx(1e-3 + 64 * 1e-5, rel=1e-9))
