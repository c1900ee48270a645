"""metrics.itl_values flattens every request's inter-token gaps exactly as requests_frame does."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from twinserve.sim.metrics import itl_values

TIMES = st.lists(st.lists(st.floats(0, 1e4, allow_nan=False), max_size=6), max_size=8)


@given(TIMES)
def test_itl_values_are_the_per_request_gaps_in_order(token_times: list) -> None:
    # requests_frame's lists (b - a per adjacent pair), flattened as summarize did.
    want = [b - a for tt in token_times for a, b in zip(tt, tt[1:])]
    got = itl_values(token_times)
    assert got.dtype == np.float64
    assert got.tolist() == want
