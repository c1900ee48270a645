"""A Mistral-style model (one sliding group) in the simulator: admission counts only the blocks its
window holds, as the KV manager frees the blocks behind the window (issue 53 item 19)."""

from __future__ import annotations

from twinserve.sim.build import simulate

from .helpers import small_config, time_limit


def _study(**kw):
    # 400 blocks of 16 = 6,400 tokens; each request holds 12,100. The window's bound:
    # (4096 - 1 + 2048) // 16 + 2 = 385 blocks.
    fields = dict(model="Mistral-7B-v0.1", hardware="H200", num_gpu_blocks=400, max_model_len=16384,
                  max_num_batched_tokens=2048, block_size=16, num_requests=3, rate=1.0,
                  prompt_dist="fixed", prompt_mean=12000, prompt_max=12000,
                  output_dist="fixed", output_mean=100, output_max=100)
    return small_config(**{**fields, **kw})


def test_a_request_longer_than_the_pool_runs_when_its_window_fits() -> None:
    with time_limit(120):
        built, result = simulate(_study())
    kv = built.simulation.core.scheduler.kv
    assert kv.num_blocks * kv.block_size < 12_100 and kv.sliding_window == 4096
    assert len(result.records) == 3
    assert all(r.finish_time is not None and r.num_output_tokens == 100 for r in result.records)
    assert kv.num_free_blocks == kv.num_blocks  # every block came back


def test_without_the_window_the_same_request_is_refused() -> None:
    """The control: the same model, pool and request as one full-attention group (kv_groups = 0)."""
    with time_limit(120):
        built, result = simulate(_study(kv_groups="0"))
    assert built.simulation.core.scheduler.kv.sliding_window is None
    assert [r.finish_reason for r in result.records] == ["refused"] * 3
    assert "whole pool holds 6400" in result.records[0].error
