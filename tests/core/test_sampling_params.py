"""Every sampling field is validated with a typed error naming it."""

import pytest

from twinserve.core import InvalidConfigError, InvalidSamplingParamsError, SamplingParams, SchedulerConfig

BAD = [
    ("n", 0), ("max_tokens", 0), ("max_tokens", 2.5), ("min_tokens", -1), ("temperature", -0.1),
    ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("top_k", 1.5),
    ("min_p", 1.1), ("presence_penalty", 2.5), ("frequency_penalty", -3),
    ("repetition_penalty", 0.0), ("seed", "x"), ("stop", [""]), ("stop_token_ids", [-1]),
    ("ignore_eos", "yes"), ("logprobs", -1), ("logprobs", 2 ** 63), ("n", True),
]


@pytest.mark.parametrize("field,value", BAD)
def test_bad_values_raise_naming_the_field(field, value):
    with pytest.raises(InvalidSamplingParamsError) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field
    assert field in str(err.value) and "allowed" in str(err.value)


def test_min_tokens_above_max_tokens():
    with pytest.raises(InvalidSamplingParamsError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)


def test_good_values_and_normalisation():
    sp = SamplingParams(temperature=0, top_k=-1, stop="###", logprobs=5, seed=3)
    assert sp.greedy and sp.stop == ["###"]
    assert sp.clone(temperature=0.7).temperature == 0.7
    with pytest.raises(InvalidSamplingParamsError):
        sp.clone(top_p=2.0)


@pytest.mark.parametrize("field,value", [("max_num_seqs", 0), ("block_size", -1), ("watermark", 1.0),
                                         ("long_prefill_token_threshold", -5)])
def test_bad_scheduler_config(field, value):
    with pytest.raises(InvalidConfigError, match=field):
        SchedulerConfig(**{field: value})


def test_unchunked_budget_must_hold_a_whole_prompt():
    with pytest.raises(InvalidConfigError, match="chunked prefill"):
        SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=4096)


def test_unknown_policy_names():
    from twinserve.core import Scheduler
    with pytest.raises(InvalidConfigError, match="policy"):
        Scheduler(SchedulerConfig(policy="lifo"))
