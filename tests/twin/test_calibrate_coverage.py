"""Issue 54 item 4: a calibration's design covers the contexts its engine will meet, up to
max_model_len (or the workload's longest request), with steps along the way and none it cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinserve.core.errors import InvalidConfigError
from twinserve.twin.calibrate import CalibrationDesign


@given(max_model_len=st.integers(64, 32768), want=st.integers(1, 40000), quick=st.booleans(),
       budget=st.sampled_from([256, 2048, 8192]))
def test_the_design_reaches_the_context_asked_for_and_runs_every_point(max_model_len: int, want: int, quick: bool,
                                                                       budget: int) -> None:
    base = CalibrationDesign.quick() if quick else CalibrationDesign()
    d = base.covering(want, max_model_len).for_limits(32, budget, max_model_len)
    top = min(want, max_model_len - 4)
    if d.decode_contexts:
        # Some decode step reaches the top (or the base design already went past it).
        assert d.reach() >= top or d.reach() >= base.reach()
        # for_limits dropped none of the added contexts: each is runnable.
        assert d.decode_contexts == [c for c in base.covering(want, max_model_len).decode_contexts
                                     if 1.5 * c + d.decode_steps + 2 < max_model_len]
        # Along the way: each added context at most about twice the reach of the one before.
        for lo, hi in zip(d.decode_contexts, d.decode_contexts[1:]):
            assert lo < hi
            if hi not in base.decode_contexts:
                assert 1.5 * hi + d.decode_steps <= 2 * (1.5 * lo + d.decode_steps) + 2
    # Every chunk size runs after every cached context.
    assert all(c + q + 1 < max_model_len for c in d.prefill_contexts for q in d.prefill_sizes)


def test_the_default_design_covers_smollm2s_length_and_the_issues_workload() -> None:
    d = CalibrationDesign()
    full = d.covering(8192, 8192).for_limits(32, 2048, 8192)
    assert full.reach() >= 8188 and full.decode_contexts[:2] == [48, 256] and len(full.decode_contexts) == 7
    # Chunks of up to the 2048-token budget after up to 5824 cached tokens: up to 7872.
    assert max(full.prefill_contexts) == 5824 and max(full.prefill_sizes) == 2048
    # The held-out ShareGPT forecast: decode contexts up to 606 (prompts <= 512, outputs <= 96).
    short = d.covering(512 + 96, 8192)
    assert short.reach() >= 608 and short.num_points() == d.num_points() + 1
    assert d.covering(300, 8192) == d  # the base design already reaches 388
    with pytest.raises(InvalidConfigError, match="max_context"):
        d.covering(0)


def test_long_decode_points_run_only_the_batches_the_kv_cache_holds() -> None:
    from twinserve.twin.calibrate import Calibrator

    class _Sched:
        block_size, num_blocks = 16, 1000  # 16,000 tokens

    class _Engine:
        scheduler_config = _Sched()

    cal = Calibrator.__new__(Calibrator)
    cal.engine = _Engine()
    assert cal._fits(32, 256, 4) and not cal._fits(32, 2067, 4)
    assert cal._fits(6, 2067, 4) and not cal._fits(9, 2067, 4)


def test_fidelity_calibrates_up_to_the_workloads_longest_request(tmp_path: Path) -> None:
    from twinserve.twin.workload import FidelityOptions, longest_request, workload_factory

    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,20\n0.1,300,40\n0.2,50,5\n")
    opts = FidelityOptions(str(tmp_path / "p.json"), trace=str(trace), num_requests=3)
    assert longest_request(workload_factory(opts, 2048, 1000)) == 340
