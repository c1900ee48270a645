"""SchedulerConfig.max_prompt_len: with chunked prefill off the step budget need hold only the longest prompt
(TensorRT-LLM launches that size --max_num_tokens for their prompts, not for --max_seq_len)."""

from __future__ import annotations

import pytest

from twinserve.core import Request, SamplingParams, Scheduler, SchedulerConfig
from twinserve.core.errors import InvalidConfigError, PromptTooLongError


def _cfg(**kw) -> SchedulerConfig:
    base = dict(max_num_batched_tokens=1152, max_model_len=2248, enable_chunked_prefill=False, block_size=16,
                num_blocks=4096, enable_prefix_caching=False)
    base.update(kw)
    return SchedulerConfig(**base)


def test_a_budget_below_max_model_len_is_refused_without_a_prompt_bound() -> None:
    with pytest.raises(InvalidConfigError, match="max_model_len"):
        _cfg().validate()


def test_a_prompt_bound_the_budget_holds_validates() -> None:
    cfg = _cfg(max_prompt_len=1024)
    cfg.validate()
    assert cfg.prompt_limit == 1024


def test_a_prompt_bound_above_the_budget_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="max_prompt_len"):
        _cfg(max_prompt_len=1200).validate()


def test_the_bound_never_exceeds_max_model_len() -> None:
    assert _cfg(max_prompt_len=99999, max_num_batched_tokens=4096).prompt_limit == 2248


def _req(rid: str, n: int, max_tokens: int = 8) -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens))


def test_a_prompt_over_the_bound_is_refused_at_admission() -> None:
    sched = Scheduler(_cfg(max_prompt_len=1024))
    with pytest.raises(PromptTooLongError, match="max_prompt_len"):
        sched.add_request(_req("a", 1025))
    sched.add_request(_req("b", 1024))


def test_prompts_that_arrive_together_are_prefilled_one_a_step() -> None:
    # Two 1,000-token prompts under a 1,152-token budget, chunking off: the first step takes one whole, the
    # second step the other beside the first's decode row.
    sched = Scheduler(_cfg(max_prompt_len=1024))
    sched.add_request(_req("a", 1000))
    sched.add_request(_req("b", 1000))
    out = sched.schedule(0.0)
    assert dict(out.num_scheduled_tokens) == {"a": 1000}
