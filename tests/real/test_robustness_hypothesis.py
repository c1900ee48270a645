"""Hypothesis over SamplingParams and EngineArgs: a typed error or a working engine, never a crash,
a hang or a dead engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.engine import LLMEngine
from twinserve.core.errors import InvalidConfigError, InvalidSamplingParamsError, PromptTooLongError, TwinserveError

# Values users send by mistake or on purpose: wrong types, signs, NaN/inf, huge and tiny numbers.
NASTY = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2 ** 31, 2 ** 63, 2 ** 64, -2 ** 63, 10 ** 30]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-45, 1e-6, 1e-5, 0.5, 1.0, 3.4e38, 1e39]),
    st.text(max_size=4), st.lists(st.integers(-2, 400), max_size=3),
    st.dictionaries(st.one_of(st.integers(-2, 400), st.text(max_size=3)), st.floats(-200, 200), max_size=2),
)
VALID = {
    "n": st.integers(1, 3), "max_tokens": st.one_of(st.none(), st.integers(1, 40)),
    "min_tokens": st.integers(0, 5), "temperature": st.floats(0, 3), "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 400), "min_p": st.floats(0, 1), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.1, 3),
    "seed": st.one_of(st.none(), st.integers(-2 ** 63, 2 ** 64 - 1)),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2), "stop_token_ids": st.lists(st.integers(0, 299), max_size=2),
    "ignore_eos": st.booleans(), "logprobs": st.one_of(st.none(), st.integers(0, 20)),
    "prompt_logprobs": st.one_of(st.none(), st.integers(0, 5)), "skip_special_tokens": st.booleans(),
    "logit_bias": st.one_of(st.none(), st.dictionaries(st.integers(0, 299), st.floats(-100, 100), max_size=3)),
}


@st.composite
def sampling_kwargs(draw: Any) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(VALID)), unique=True, max_size=6))
    return {name: draw(st.one_of(VALID[name], NASTY) if draw(st.booleans()) else VALID[name]) for name in names}


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> LLMEngine:
    return LLMEngine(EngineArgs(model=str(tiny_dir), dtype="float64", max_model_len=32,
                                num_gpu_blocks_override=64, block_size=4, max_num_batched_tokens=32))


def _run(engine: LLMEngine, rid: str, params: SamplingParams) -> None:
    engine.add_request(rid, {"prompt_token_ids": [5, 6, 7, 8, 9]}, params)
    for _ in range(200):
        if not engine.has_unfinished_requests():
            return
        engine.step()
    raise AssertionError("the request did not finish within 200 steps")


@given(kw=sampling_kwargs())
@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_sampling_params_are_a_typed_error_or_a_finished_request(engine: LLMEngine, kw: dict[str, Any]) -> None:
    try:
        params = SamplingParams(**kw)
    except InvalidSamplingParamsError as e:
        assert e.field in kw
        return
    rid = f"r{id(params)}"
    try:
        _run(engine, rid, params)
    except TwinserveError:
        pass  # refused by the engine (e.g. a logit_bias id outside the vocabulary): typed, and nothing queued
    assert engine.dead is None
    assert not engine.has_unfinished_requests()
    assert engine.core.scheduler.kv.num_free_blocks == engine.scheduler_config.num_blocks


def test_n_beyond_the_engine_bound_is_refused_quickly(engine: LLMEngine) -> None:
    with pytest.raises(InvalidSamplingParamsError, match="n="):
        engine.add_request("huge-n", {"prompt_token_ids": [5, 6]}, SamplingParams(n=2 ** 40))
    assert not engine.has_unfinished_requests()


ENGINE_VALID = {
    "dtype": st.sampled_from(["auto", "float32", "float64", "bf16"]), "seed": st.integers(0, 2 ** 32),
    "max_model_len": st.one_of(st.none(), st.integers(8, 256)), "max_num_seqs": st.integers(1, 64),
    "max_num_batched_tokens": st.one_of(st.none(), st.integers(8, 512)), "block_size": st.sampled_from([1, 4, 16]),
    "enable_prefix_caching": st.booleans(), "enable_chunked_prefill": st.booleans(),
    "long_prefill_token_threshold": st.integers(0, 64), "num_gpu_blocks_override": st.one_of(st.none(), st.integers(1, 128)),
    "kv_cache_memory_gb": st.floats(0.0001, 0.01), "gpu_memory_utilization": st.floats(0.01, 1),
    "policy": st.sampled_from(["fcfs", "priority", "sjf", "lifo"]), "preemption": st.sampled_from(["auto", "last", "x"]),
    "max_logprobs": st.integers(0, 20), "device": st.sampled_from(["auto", "cpu", "tpu", "cpu:0"]),
    "attention_backend": st.sampled_from(["auto", "torch", "nope"]),
    "small_batch_rows": st.one_of(st.none(), st.integers(1, 128)),
}


@st.composite
def engine_kwargs(draw: Any) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(ENGINE_VALID)), unique=True, max_size=5))
    return {n: draw(st.one_of(ENGINE_VALID[n], NASTY) if draw(st.booleans()) else ENGINE_VALID[n]) for n in names}


@given(kw=engine_kwargs())
@example(kw={"num_gpu_blocks_override": 1, "block_size": 1})  # a pool smaller than the probe
@settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_engine_args_are_a_typed_error_or_a_working_engine(tiny_dir: Path, kw: dict[str, Any]) -> None:
    try:
        args = EngineArgs(model=str(tiny_dir), **kw)
    except InvalidConfigError as e:
        assert e.field in kw
        return
    try:
        engine = LLMEngine(args)
    except TwinserveError:
        return  # e.g. an unknown policy, or a context longer than the model's: typed
    probe = SamplingParams(max_tokens=3, ignore_eos=True)
    try:
        engine.add_request("probe", {"prompt_token_ids": [5, 6, 7]}, probe)
    except PromptTooLongError:
        # A KV pool (or context) too small for the probe's 5 tokens refuses it up front, typed;
        # anything bigger must serve it.
        cfg = engine.scheduler_config
        assert cfg.num_blocks * cfg.block_size < 5 or cfg.max_model_len < 6
        assert not engine.has_unfinished_requests()
        return
    finished = []
    for _ in range(100):
        finished += [o for o in engine.step() if o.finished]
        if finished:
            break
    assert finished and len(finished[0].outputs[0].token_ids) == 3
    assert engine.dead is None
