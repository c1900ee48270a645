"""The real engine under `batch_policy = "prefill_first"`: lock-step batches, the same greedy tokens."""

from __future__ import annotations

from twinserve.backends.real import SamplingParams
from twinserve.core.sched.batch_policy import is_prefilling

from .conftest import prompts_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _tokens_and_steps(llm, prompts: list[list[int]]) -> tuple[list[list[int]], list[set[str]]]:
    """Each prompt's greedy tokens, and per step what it held: {'prefill'}, {'decode'} or both."""
    sched = llm.llm_engine.core.scheduler
    schedule = sched.schedule
    kinds: list[set[str]] = []

    def watched(now: float):
        before = {r.request_id: is_prefilling(r) for r in sched.running}
        so = schedule(now)
        kinds.append({"prefill" if before.get(rid, True) else "decode" for rid in so.num_scheduled_tokens})
        return so

    sched.schedule = watched
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    finally:
        del sched.schedule
    return [o.outputs[0].token_ids for o in outs], kinds


def test_prefill_first_gives_the_mixed_tokens_in_lock_step(make_llm) -> None:
    prompts = prompts_ids(6, seed=7, lo=5, hi=30)
    # A 16-token budget chunks the prompts across steps, with decodes already running.
    kw = dict(max_num_batched_tokens=16, engine_core_mode="inproc")
    mixed, mixed_kinds = _tokens_and_steps(make_llm(batch_policy="mixed", **kw), prompts)
    first, first_kinds = _tokens_and_steps(make_llm(batch_policy="prefill_first", **kw), prompts)
    assert first == mixed
    assert any(k == {"prefill", "decode"} for k in mixed_kinds)  # the scenario does mix under `mixed`
    assert all(len(k) <= 1 for k in first_kinds), first_kinds
    assert {"decode"} in first_kinds and {"prefill"} in first_kinds
