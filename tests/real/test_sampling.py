"""Random sampling: seeds independent of batch company, parameters that do what they say, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.sampler import Sampler, SamplingRow

from .conftest import prompts_ids


def _gen(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_seeded_sampling_ignores_batch_company(make_llm) -> None:
    llm = make_llm(max_num_batched_tokens=16)
    prompt = prompts_ids(1, seed=9)[0]
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=30, ignore_eos=True)
    alone = _gen(llm, [prompt], sp)[0]
    others = prompts_ids(7, seed=10)
    company = [SamplingParams(temperature=0.8, seed=i, max_tokens=20 + i, ignore_eos=True) for i in range(7)]
    mixed = llm.generate([{"prompt_token_ids": p} for p in others[:3] + [prompt] + others[3:]],
                         company[:3] + [sp] + company[3:], use_tqdm=False)
    assert mixed[3].outputs[0].token_ids == alone
    other_seed = _gen(llm, [prompt], sp.clone(seed=99))[0]
    assert other_seed != alone  # the seed matters


def test_top_k_one_is_greedy_and_temperature_spreads(make_llm) -> None:
    llm = make_llm()
    prompts = prompts_ids(3, seed=11)
    greedy = _gen(llm, prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    topk1 = _gen(llm, prompts, SamplingParams(temperature=1.5, top_k=1, max_tokens=16, ignore_eos=True, seed=3))
    assert greedy == topk1
    hot = _gen(llm, prompts, SamplingParams(temperature=1.5, max_tokens=16, ignore_eos=True, seed=3))
    assert hot != greedy


def test_n_fans_out_into_distinct_seeded_samples(make_llm) -> None:
    llm = make_llm()
    prompt = prompts_ids(1, seed=12)[0]
    sp = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    seqs = [tuple(c.token_ids) for c in out.outputs]
    assert len(set(seqs)) == 3 and all(len(s) == 12 for s in seqs)
    again = llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0]
    assert [tuple(c.token_ids) for c in again.outputs] == seqs


def test_min_tokens_masks_eos(make_llm, tiny_dir) -> None:
    llm = make_llm()
    eos = llm.get_tokenizer().eos_token_id
    prompts = prompts_ids(4, seed=13)
    # Two thirds of the vocabulary ends the request: without masking it would stop at once.
    stop_ids = list(range(3, 200))
    sp = SamplingParams(temperature=1.0, seed=5, max_tokens=12, min_tokens=6, stop_token_ids=stop_ids)
    outs = _gen(llm, prompts, sp)
    for toks in outs:
        assert len(toks) >= 6
        assert all(t not in stop_ids and t != eos for t in toks[:6])
    assert any(len(t) < 12 for t in outs)  # the stop ids do stop once allowed


def _rows(params: list[SamplingParams], outputs: list[list[int]]) -> list[SamplingRow]:
    return [SamplingRow(p, [1, 2] + o, 2, p.seed or 0, [0]) for p, o in zip(params, outputs)]


def test_sampler_penalties_and_filters_on_known_logits() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.tensor([[2.0, 1.9, 0.5, -1.0, 0.0]])
    # Frequency penalty on a repeated token 0 makes token 1 the argmax.
    sp = SamplingParams(temperature=0, frequency_penalty=0.1, max_tokens=5)
    toks, _ = sampler(logits, _rows([sp], [[0, 0]]))
    assert toks == [1]
    # Repetition penalty divides positive logits of seen tokens (prompt tokens 1 and 2 here).
    sp = SamplingParams(temperature=0, repetition_penalty=2.0, max_tokens=5)
    toks, _ = sampler(torch.tensor([[1.0, 1.5, 1.2, 0.0, 0.0]]), _rows([sp], [[]]))
    assert toks == [0]
    # top_k=2 never yields anything outside the two best; min_p=0.5 keeps only near-best tokens.
    for params in (SamplingParams(temperature=1.0, top_k=2, seed=1), SamplingParams(temperature=1.0, min_p=0.5, seed=1),
                   SamplingParams(temperature=1.0, top_p=0.5, seed=1)):
        seen = set()
        for s in range(200):
            toks, _ = sampler(logits, _rows([params.clone(seed=s)], [[]]))
            seen.add(toks[0])
        assert seen <= {0, 1}, params
        assert seen == {0, 1} or params.top_p < 1.0


def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    sp = SamplingParams(temperature=0, logprobs=3)
    toks, lps = sampler(logits, _rows([sp, sp], [[], []]))
    ref = torch.log_softmax(logits, dim=-1)
    for i in range(2):
        lp = lps[i]
        assert lp is not None and lp.token_id == toks[i] and lp.rank == 1
        assert math.isclose(lp.logprob, float(ref[i, toks[i]]), rel_tol=1e-6)
        assert [t for t, _ in lp.top] == ref[i].topk(3).indices.tolist()


def test_engine_returns_logprobs(make_llm) -> None:
    llm = make_llm()
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=4, logprobs=2,
                                                                         ignore_eos=True), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.logprobs is not None and len(c.logprobs) == 4
    assert [lp.token_id for lp in c.logprobs] == c.token_ids
    assert all(len(lp.top) == 2 and lp.rank == 1 for lp in c.logprobs)


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-5), dict(min_p=2.0),
                                 dict(presence_penalty=3.0), dict(max_tokens=0), dict(n=0)])
def test_bad_sampling_values_raise_typed_errors(bad: dict) -> None:
    from twinserve.core.errors import InvalidSamplingParamsError

    with pytest.raises(InvalidSamplingParamsError, match=next(iter(bad))):
        SamplingParams(**bad)
