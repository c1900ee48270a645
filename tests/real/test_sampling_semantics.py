"""Sampler semantics as vLLM users expect: tiny temperatures are greedy, min-p before top-k/top-p,
logit_bias, representable ranges, and a request whose inputs break sampling ends alone."""

from __future__ import annotations

import math

import pytest
import torch

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.sampler import Sampler, SamplingRow
from twinserve.core.errors import InvalidSamplingParamsError

from .conftest import add_with_bad_stop_id, hf_greedy, prompts_ids


def _row(p: SamplingParams, out: list[int] | None = None) -> SamplingRow:
    return SamplingRow(p, [1, 2] + (out or []), 2, p.seed or 0, [0])


@pytest.mark.parametrize("temperature", [1e-45, 1e-30, 1e-6, 9.99e-6])
def test_tiny_temperature_is_greedy(temperature: float) -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(1)) * 5
    sp = SamplingParams(temperature=temperature, seed=3)
    assert sp.greedy
    toks, _ = sampler(logits, [_row(sp.clone(seed=s)) for s in range(4)])
    assert toks == logits.argmax(dim=-1).tolist()


def test_tiny_temperature_through_the_engine_matches_transformers(make_llm, tiny_dir) -> None:
    llm = make_llm()
    prompt = prompts_ids(1, seed=21)[0]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=1e-45, max_tokens=12,
                                                                      ignore_eos=True, seed=5),
                       use_tqdm=False)[0].outputs[0].token_ids
    assert out == hf_greedy(tiny_dir, prompt, 12)


def test_min_p_filters_before_top_p() -> None:
    # p = [.4, .3, .2, .1]. vLLM: min_p=0.6 keeps {0, 1} (>= .24); renormalised [4/7, 3/7], then
    # top_p=0.5 keeps token 0 alone. Applying top_p first would keep {0, 1} and let 1 be drawn.
    sampler = Sampler(torch.device("cpu"))
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    seen = set()
    for s in range(60):
        sp = SamplingParams(temperature=1.0, min_p=0.6, top_p=0.5, seed=s)
        seen.add(sampler(logits, [_row(sp)])[0][0])
    assert seen == {0}


def test_min_p_uses_the_tempered_distribution() -> None:
    # At temperature 2 the probabilities flatten: token 1 passes min_p=0.5 only after tempering.
    sampler = Sampler(torch.device("cpu"))
    logits = torch.tensor([[1.0, 0.0, -10.0]])  # p1/p0 = e^-1 ~ .37 raw, e^-.5 ~ .61 at T=2
    seen = {sampler(logits, [_row(SamplingParams(temperature=2.0, min_p=0.5, seed=s))])[0][0] for s in range(80)}
    assert seen == {0, 1}


def test_logit_bias_forces_and_bans_tokens(make_llm) -> None:
    llm = make_llm()
    prompt = prompts_ids(1, seed=22)[0]
    base = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    plain = llm.generate([{"prompt_token_ids": prompt}], base, use_tqdm=False)[0].outputs[0].token_ids
    forced = llm.generate([{"prompt_token_ids": prompt}], base.clone(logit_bias={"77": 100}),
                          use_tqdm=False)[0].outputs[0].token_ids
    assert forced == [77] * 6
    banned = llm.generate([{"prompt_token_ids": prompt}], base.clone(logit_bias={plain[0]: -100}),
                          use_tqdm=False)[0].outputs[0].token_ids
    assert banned[0] != plain[0]
    # Sampled rows see the bias too.
    hot = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=1.0, seed=4, max_tokens=6,
                                                                      ignore_eos=True, logit_bias={5: 100.0}),
                       use_tqdm=False)[0].outputs[0].token_ids
    assert hot == [5] * 6


def test_sampler_logit_bias_is_added_to_the_logits() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    toks, _ = sampler(logits, [_row(SamplingParams(temperature=0, logit_bias={2: 2.5}))])
    assert toks == [2]
    toks, _ = sampler(logits, [_row(SamplingParams(temperature=0, logit_bias={2: 1.5}))])
    assert toks == [0]


@pytest.mark.parametrize("field,value", [
    ("top_k", 2 ** 63), ("top_k", 10 ** 4000), ("max_tokens", 2 ** 64), ("n", 2 ** 63), ("min_tokens", 2 ** 70),
    ("temperature", 1e39), ("repetition_penalty", 1e300), ("seed", 2 ** 80), ("stop_token_ids", [2 ** 63]),
    ("logit_bias", {1: 101}), ("logit_bias", {1: float("nan")}), ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"x": 1.0}), ("logit_bias", [1, 2]), ("prompt_logprobs", 2 ** 63), ("temperature", 10 ** 400),
    ("stop", 5), ("stop_token_ids", 7), ("skip_special_tokens", "no"),
], ids=lambda v: v if isinstance(v, str) else "value")
def test_values_outside_the_representable_range_are_typed_errors(field: str, value: object) -> None:
    with pytest.raises(InvalidSamplingParamsError) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field
    assert len(str(err.value)) < 400


def test_extreme_but_valid_values_sample_without_nan() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(2))
    rows = [_row(SamplingParams(temperature=3.4e38, seed=1, min_tokens=3, max_tokens=5)),
            _row(SamplingParams(temperature=1.0, top_k=2 ** 63 - 1, seed=2)),
            _row(SamplingParams(temperature=0.5, repetition_penalty=3.4e38, seed=3), [7, 8])]
    toks, _ = sampler(logits, rows)
    assert toks[0] != 0  # the min_tokens mask survives a huge temperature (no -inf / inf = NaN)
    assert all(0 <= t < 300 for t in toks)


def test_one_requests_sampling_failure_ends_only_that_request(make_llm, tiny_dir) -> None:
    llm = make_llm()
    engine = llm.llm_engine
    good_prompt, bad_prompt = prompts_ids(2, seed=23)
    sp = SamplingParams(temperature=0.7, seed=1, max_tokens=8, min_tokens=4, ignore_eos=True)
    engine.add_request("good", {"prompt_token_ids": good_prompt}, SamplingParams(temperature=0, max_tokens=8,
                                                                                 ignore_eos=True))
    # Corrupted past validation; tests/real/test_engine_core_process.py does the same with the core
    # in a process.
    add_with_bad_stop_id(engine, "bad", bad_prompt, sp)
    finished = {}
    for _ in range(50):
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        if len(finished) == 2:
            break
    assert finished["bad"].outputs[0].finish_reason == "error"
    assert "sampling failed" in (finished["bad"].outputs[0].error or "")
    assert finished["good"].outputs[0].token_ids == hf_greedy(tiny_dir, good_prompt, 8)
    assert engine.dead is None
    assert engine.core.scheduler.kv.num_free_blocks == engine.scheduler_config.num_blocks
    again = llm.generate([{"prompt_token_ids": bad_prompt}], sp, use_tqdm=False)[0].outputs[0]
    assert again.finish_reason == "length" and len(again.token_ids) == 8


def test_prompt_logprobs_equal_transformers(make_llm, tiny_dir) -> None:
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float64).eval()
    prompt = prompts_ids(1, seed=24, lo=30, hi=31)[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    # Chunked prefill (8 tokens a step) and a warm prefix cache must not lose or shift positions.
    llm = make_llm(max_num_batched_tokens=8)
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1), use_tqdm=False)
    sp = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3, logprobs=2, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0]
    plp = out.prompt_logprobs
    assert plp is not None and len(plp) == len(prompt) and plp[0] is None
    for i in range(1, len(prompt)):
        rec = plp[i]
        assert rec is not None and rec.token_id == prompt[i]
        assert math.isclose(rec.logprob, float(ref[i - 1, prompt[i]]), abs_tol=1e-5)
        assert rec.rank == int((ref[i - 1] > ref[i - 1, prompt[i]]).sum()) + 1
        assert [t for t, _ in rec.top] == ref[i - 1].topk(3).indices.tolist()
    first = out.outputs[0].logprobs[0]
    assert math.isclose(first.logprob, float(ref[-1].max()), abs_tol=1e-5)


def test_prompt_logprobs_with_n_are_computed_once(make_llm) -> None:
    llm = make_llm()
    prompt = prompts_ids(1, seed=25)[0]
    out = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(n=3, temperature=1.0, seed=2, max_tokens=3, prompt_logprobs=0),
                       use_tqdm=False)[0]
    assert out.prompt_logprobs is not None and all(r is not None for r in out.prompt_logprobs[1:])
    assert all(r.top == [] for r in out.prompt_logprobs[1:])
