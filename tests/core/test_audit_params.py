"""min_tokens at its edge (docs/test-audit.md)."""

from __future__ import annotations

import pytest

from twinserve.core import EngineCore, SchedulerConfig
from twinserve.core.errors import InvalidSamplingParamsError
from twinserve.core.fake_executor import FakeExecutor

from .helpers import make_request
from ..limits import bounded


def test_min_tokens_equal_to_max_tokens_is_valid_and_gives_exactly_that_many() -> None:
    # "At least n and at most n tokens" is a common way to ask for exactly n, stop ids or not.
    core = EngineCore(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4,
                                      num_blocks=32), FakeExecutor(block_size=4))
    req = make_request("exact", [1, 2, 3], 6, min_tokens=6, stop_token_ids=list(range(1000)), eos_token_id=0)
    core.add_request(req)
    outs: list[int] = []
    t = 0.0
    for _ in bounded():
        if not core.has_unfinished_requests():
            break
        for o in core.step(t)[0]:
            outs += o.new_token_ids
        t += 1.0
    assert len(outs) == 6 and req.finish_reason.value == "length"
    with pytest.raises(InvalidSamplingParamsError, match="min_tokens"):
        make_request("over", [1], 6, min_tokens=7)
