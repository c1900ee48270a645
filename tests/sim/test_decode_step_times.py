"""The roofline model's decode-window timing gives the floats the generic step_time loop gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.sim import RooflineCostModel, get_hardware, get_model
from twinserve.backends.sim.cost_model import Efficiency
from twinserve.backends.sim.executor import SimExecutor


class _StepTimeOnly:
    """The same model seen through step_time alone: SimExecutor's generic loop prices it."""

    name = "step_time only"

    def __init__(self, model: RooflineCostModel) -> None:
        self.step_time = model.step_time


@settings(max_examples=300, deadline=None)
@given(model=st.sampled_from(["Llama-2-7B", "Llama-2-70B", "SmolLM2-135M", "Llama-3-8B"]),
       hardware=st.sampled_from(["A100-80GB", "H100-SXM"]),
       tp=st.sampled_from([1, 2, 4, 8]),
       floor=st.sampled_from([0.0, 17e-6, 5e-4]),
       overhead=st.sampled_from([0.0, 1.5e-3]),
       num_seqs=st.integers(1, 512), context=st.integers(0, 4_000_000),
       max_steps=st.integers(0, 300), start=st.floats(0.0, 1e5),
       horizon=st.floats(0.0, 5.0) | st.just(float("inf")))
def test_decode_step_times_equal_generic_loop(model, hardware, tp, floor, overhead, num_seqs,
                                              context, max_steps, start, horizon):
    m, h = get_model(model), get_hardware(hardware)
    if m.num_heads % tp or (m.num_kv_heads % tp and tp % m.num_kv_heads):
        tp = 1
    eff = Efficiency.for_hardware(h, layer_floor_s=floor, step_overhead_s=overhead)
    roof = RooflineCostModel(m, h, tp, eff)
    deadline = start + horizon
    fast = SimExecutor(roof).decode_step_times(num_seqs, context, max_steps, start, deadline)
    slow = SimExecutor(_StepTimeOnly(roof)).decode_step_times(num_seqs, context, max_steps,
                                                              start, deadline)
    assert fast == slow  # exact: the same floats, the same number of steps
    assert len(fast[0]) <= max_steps
