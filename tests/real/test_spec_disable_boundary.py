"""disable_by_batch_size at its boundary, the simulator against the real engine: both follow
SpeculativeConfig.active (no drafts while the batch holds disable_by_batch_size requests or more, as
vLLM's `running_queue_size >= disable_by_batch_size`), in the scheduler and in the executor's
proposals, so the two schedule the same steps.

The simulated executor proposed drafts for a batch of exactly disable_by_batch_size (the real model
runner proposes none there), so the step after that batch shrank verified drafts in the simulator
and none in the engine: one verify step early, each time the batch crossed the boundary.
"""

from __future__ import annotations

import pytest

from twinserve.backends.real import SamplingParams
from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.fitted import FittedCostModel
from twinserve.backends.sim.spec import SpecAcceptance
from twinserve.core import EngineCore, Request
from twinserve.core.sampling_params import SamplingParams as CoreParams

from .conftest import prompts_ids
from .test_spec_decode import NGRAM, OracleProposer
from ..limits import bounded

K = 3
# (request, arrival step, max_tokens): r0 drafts alone, r1 and r2 join (3 running, then 2 at the
# boundary: no drafts), they end, and r0 drafts again.
PLAN = [("r0", 0, 24), ("r1", 3, 2), ("r2", 3, 5)]


def _steps(core: EngineCore, step, add) -> list[tuple]:
    """Each step's (tokens scheduled per request, drafts verified per request)."""
    out = []
    for i in bounded(200, "the plan"):
        add(i)
        if i > max(at for _, at, _ in PLAN) and not core.has_unfinished_requests():
            return out
        step(i)
        so = core.last_scheduler_output
        out.append((sorted(so.num_scheduled_tokens.items()),
                    sorted((r, len(d)) for r, d in so.scheduled_spec_decode_tokens.items())))
    raise AssertionError("unreachable")


@pytest.mark.parametrize("disable", [2, 3])
def test_the_simulator_drafts_on_the_steps_the_engine_does(make_llm, disable: int) -> None:
    prompts = prompts_ids(len(PLAN), seed=41, lo=5, hi=12)
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    refs = [p + o.outputs[0].token_ids for p, o in zip(prompts, make_llm().generate(
        [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False))]
    llm = make_llm(engine_core_mode="inproc",
                   speculative_config={**NGRAM, "num_speculative_tokens": K, "disable_by_batch_size": disable})
    llm.llm_engine.worker.runner.proposer = OracleProposer(refs, K, miss=10_000)  # every draft right
    eng = llm.llm_engine

    def add_real(i: int) -> None:
        for (rid, at, n), p in zip(PLAN, prompts):
            if at == i:
                eng.add_request(rid, {"prompt_token_ids": p},
                                SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    real = _steps(eng.core, lambda i: eng.step(), add_real)

    spec = eng.core.scheduler.spec
    ex = SimExecutor(FittedCostModel(intercept_s=0.01))
    ex.spec = SpecAcceptance(K, [1.0] * K)  # every draft accepted, as the oracle's
    ex.spec_active = spec.active
    sim = EngineCore(eng.core.config, ex, speculative_config=spec)

    def add_sim(i: int) -> None:
        for (rid, at, n), p in zip(PLAN, prompts):
            if at == i:
                sim.add_request(Request(rid, list(p), CoreParams(max_tokens=n, ignore_eos=True)))
    simulated = _steps(sim, lambda i: sim.step(float(i)), add_sim)

    verified = [dict(d) for _, d in real]
    assert any(verified[:3]) and any(v for v in verified[6:])  # drafts before the others joined and after
    assert simulated == real
