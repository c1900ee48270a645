"""The host tier's copies on the CPU: separate tensors, stores before loads, exact bytes back."""

from __future__ import annotations

import pytest
import torch

from twinserve.backends.real.host_kv import HostKVCache
from twinserve.core.errors import InvalidConfigError
from twinserve.core.sched.output import CachedRequestData, SchedulerOutput


def _so(stores=(), loads=None) -> SchedulerOutput:
    return SchedulerOutput([], CachedRequestData(), {}, 0, [], set(), kv_stores=list(stores), kv_loads=loads or {})


def test_a_store_then_a_load_in_one_step_moves_the_exact_block_and_reports_the_job():
    dev = [torch.randn(6, 4, 2, 8) for _ in range(4)]
    host = HostKVCache(dev, 6 * 4 * 2 * 8 * 4 * 4 / (1 << 30), torch.device("cpu"))
    assert host.num_blocks == 6 and all(h.data_ptr() != d.data_ptr() for h, d in zip(host.host_tensors, dev))
    before = [d[2].clone() for d in dev]
    # Block 2 goes out to slot 5; the same step loads slot 5 into block 4 (stores run first).
    done = host.run(_so([(2, 5)], {7: [(5, 4)]}))
    assert done == [7]
    for d, b in zip(dev, before):
        d[2].zero_()  # the block's next owner writes it
        assert torch.equal(d[4], b)
    assert torch.equal(host.host_tensors[0][5], before[0])
    assert (host.blocks_stored, host.blocks_loaded) == (1, 1)


@pytest.mark.parametrize("gib", [1e-9, 0.0])
def test_a_tier_under_one_block_is_refused_with_the_block_size(gib):
    with pytest.raises(InvalidConfigError, match="kv_offloading_size.*bytes"):
        HostKVCache([torch.zeros(4, 16, 2, 8)], gib, torch.device("cpu"))
