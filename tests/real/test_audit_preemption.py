"""A preempted request resumes as if never stopped: seeded draws and penalties see its generated tokens."""

from __future__ import annotations

from twinserve.backends.real import SamplingParams

from .conftest import prompts_ids


def test_seeded_sampling_with_penalties_is_the_same_under_preemption(make_llm) -> None:
    prompts = prompts_ids(8, seed=3)
    # Random draws (a seed each) and a penalty over generated tokens: both depend on which tokens the
    # engine counts as output, which a resumed request must keep counting.
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=24, ignore_eos=True,
                             presence_penalty=1.5 if i % 2 else 0.0) for i in range(len(prompts))]
    batch = [{"prompt_token_ids": p} for p in prompts]
    roomy = make_llm().generate(batch, params, use_tqdm=False)
    # 96 token slots for 8 requests of up to ~60 tokens: some are preempted and recomputed.
    tight = make_llm(num_gpu_blocks_override=24).generate(batch, params, use_tqdm=False)
    assert sum(o.metrics.num_preemptions for o in tight) > 0
    assert sum(o.metrics.num_preemptions for o in roomy) == 0
    for a, b in zip(roomy, tight):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids, b.metrics.num_preemptions
