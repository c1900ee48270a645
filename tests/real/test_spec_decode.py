"""Speculative decoding in the real engine: greedy outputs token-identical to plain decoding.

A random tiny model rarely repeats itself, so besides the real n-gram proposer the tests
plant an oracle proposer that drafts plain decoding's own continuation with misses at
known positions: runs of several accepted drafts, rejections and rollbacks then happen
under preemption, prefix hits and chunked prefill, through the real KV cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from twinserve.backends.real import SamplingParams
from twinserve.core.errors import InvalidConfigError

from .conftest import prompts_ids

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


class OracleProposer:
    """Drafts the reference continuation of whichever reference the sequence is a prefix of."""

    def __init__(self, refs: list[list[int]], k: int, miss: int) -> None:
        self.refs, self.k, self.miss = refs, k, miss

    def propose(self, token_ids: np.ndarray) -> list[int]:
        seq = token_ids.tolist()
        n = len(seq)
        for ref in self.refs:
            if ref[:n] == seq:
                drafts = ref[n:n + self.k]
                # A miss at every position divisible by `miss`: rejections at known places.
                return [t + 1 if (n + j) % self.miss == 0 else t for j, t in enumerate(drafts)]
        return []


def _gen(llm, prompts, params=GREEDY):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def _prompts() -> list[list[int]]:
    shared = prompts_ids(1, seed=5, lo=13, hi=14)[0]
    pattern = [5, 17, 33, 60, 61, 62, 9]
    return ([shared + p for p in prompts_ids(3, seed=2, lo=2, hi=9)] + [pattern * 4 + [11]]
            + prompts_ids(3, seed=3))


@pytest.mark.parametrize("engine_kw", [
    {"enable_prefix_caching": True},
    {"max_num_batched_tokens": 7, "long_prefill_token_threshold": 3, "max_num_seqs": 3},
    {"num_gpu_blocks_override": 24},  # forces preemption
], ids=["prefix-cache", "chunked", "preemption"])
def test_greedy_with_drafts_is_token_identical_to_plain(make_llm, engine_kw: dict) -> None:
    prompts = _prompts()
    plain = [o.outputs[0].token_ids for o in _gen(make_llm(**engine_kw), prompts)]
    refs = [p + o for p, o in zip(prompts, plain)]
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 5}, **engine_kw)
    runner = llm.llm_engine.worker.runner
    _gen(llm, prompts[:1])  # warms the prefix cache with the shared prefix
    runner.proposer = OracleProposer(refs, 5, miss=4)
    outs = _gen(llm, prompts)
    assert [o.outputs[0].token_ids for o in outs] == plain
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0 < accepted < drafted
    # Several drafts accepted in one step: fewer steps than tokens.
    assert accepted > sum(len(p) for p in plain) // 3
    if engine_kw.get("num_gpu_blocks_override"):
        assert sum(o.metrics.num_preemptions for o in outs) > 0
    if engine_kw.get("enable_prefix_caching"):
        assert sum(o.metrics.num_cached_tokens for o in outs[:3]) >= 3 * 12


def test_ngram_greedy_is_token_identical_to_plain(make_llm) -> None:
    prompts = _prompts()
    plain = [o.outputs[0].token_ids for o in _gen(make_llm(), prompts)]
    outs = _gen(make_llm(speculative_config=NGRAM), prompts)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0


def test_a_stop_string_inside_an_accepted_run_ends_the_output_as_plain_decoding_does(make_llm) -> None:
    prompts = _prompts()[3:4]
    llm_plain = make_llm()
    full = _gen(llm_plain, prompts)[0].outputs[0]
    stop_text = llm_plain.get_tokenizer().decode(full.token_ids[9:11])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop_text])
    plain = _gen(llm_plain, prompts, params)[0].outputs[0]
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 6})
    llm.llm_engine.worker.runner.proposer = OracleProposer([prompts[0] + full.token_ids], 6, miss=100)
    spec = _gen(llm, prompts, params)[0].outputs[0]
    assert plain.finish_reason == "stop" and len(plain.token_ids) < 24
    assert (spec.text, spec.token_ids, spec.finish_reason) == (plain.text, plain.token_ids, "stop")


def test_sampling_with_drafts_is_reproducible_by_seed_and_counts_acceptance(make_llm) -> None:
    prompts = _prompts()[:4]
    params = SamplingParams(temperature=0.3, top_p=0.9, max_tokens=16, seed=3, ignore_eos=True)
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 3})
    refs = [p + o.outputs[0].token_ids for p, o in zip(prompts, _gen(make_llm(), prompts, params))]
    llm.llm_engine.worker.runner.proposer = OracleProposer(refs, 3, miss=1000)
    a = _gen(llm, prompts, params)
    b = _gen(llm, prompts, params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(len(o.outputs[0].token_ids) == 16 for o in a)
    assert sum(o.metrics.num_accepted_tokens for o in a) > 0


def test_logprobs_with_drafts_equal_plain_decoding(make_llm) -> None:
    prompts = _prompts()[:4]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3)
    plain = [o.outputs[0] for o in _gen(make_llm(), prompts, params)]
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 4})
    llm.llm_engine.worker.runner.proposer = OracleProposer(
        [p + o.token_ids for p, o in zip(prompts, plain)], 4, miss=3)
    outs = _gen(llm, prompts, params)
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
    for o, ref in zip(outs, plain):
        c = o.outputs[0]
        assert c.token_ids == ref.token_ids
        assert len(c.logprobs) == len(c.token_ids)
        for got, want in zip(c.logprobs, ref.logprobs):
            assert (got.token_id, got.rank) == (want.token_id, want.rank)
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
            assert [t for t, _ in got.top] == [t for t, _ in want.top]


def test_logprobs_stop_with_the_tokens_a_stop_cuts(make_llm) -> None:
    prompts = _prompts()[3:4]
    llm_plain = make_llm()
    full = _gen(llm_plain, prompts)[0].outputs[0]
    stop_id = full.token_ids[6]
    params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_id], logprobs=1)
    plain = _gen(llm_plain, prompts, params)[0].outputs[0]
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 6})
    llm.llm_engine.worker.runner.proposer = OracleProposer([prompts[0] + full.token_ids], 6, miss=100)
    spec = _gen(llm, prompts, params)[0].outputs[0]
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop"
    assert [lp.token_id for lp in spec.logprobs] == spec.token_ids


def test_a_stop_string_inside_an_accepted_run_cuts_the_logprobs_with_the_tokens(make_llm) -> None:
    prompts = _prompts()[3:4]
    llm_plain = make_llm()
    full = _gen(llm_plain, prompts)[0].outputs[0]
    stop_text = llm_plain.get_tokenizer().decode(full.token_ids[9:11])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop_text], logprobs=1)
    plain = _gen(llm_plain, prompts, params)[0].outputs[0]
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 6})
    llm.llm_engine.worker.runner.proposer = OracleProposer([prompts[0] + full.token_ids], 6, miss=100)
    spec = _gen(llm, prompts, params)[0].outputs[0]
    assert spec.finish_reason == "stop" and spec.token_ids == plain.token_ids
    # The run that held the stop string was accepted whole: its logprobs past the stop go too.
    assert [lp.token_id for lp in spec.logprobs] == spec.token_ids == [lp.token_id for lp in plain.logprobs]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_structured_output_with_drafts_keeps_the_grammar(make_llm, temperature: float) -> None:
    import json

    from twinserve.core.structured_output import StructuredOutputSpec

    schema = {"type": "object", "properties": {"a": {"type": "string", "enum": ["yes", "no"]},
                                               "n": {"type": "integer", "enum": [0, 1, 2]}},
              "required": ["a", "n"], "additionalProperties": False}
    spec = StructuredOutputSpec("json", json.dumps(schema), "guided")
    prompts = _prompts()[:3]
    params = SamplingParams(temperature=temperature, max_tokens=60, seed=7, structured_output=spec)
    plain = [o.outputs[0] for o in _gen(make_llm(), prompts, params)]
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 4})
    # Drafts follow plain decoding but miss every third position: a miss is usually a token the
    # grammar refuses, which verification must reject, never emit.
    llm.llm_engine.worker.runner.proposer = OracleProposer(
        [p + o.token_ids for p, o in zip(prompts, plain)], 4, miss=3)
    outs = [o for o in _gen(llm, prompts, params)]
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
    assert sum(o.metrics.num_draft_tokens - o.metrics.num_accepted_tokens for o in outs) > 0
    for o, ref in zip(outs, plain):
        c = o.outputs[0]
        assert set(json.loads(c.text)) == {"a", "n"}
        if temperature == 0.0:
            assert c.token_ids == ref.token_ids


def test_no_ngram_proposals_are_computed_while_the_batch_is_at_disable_by_batch_size(make_llm) -> None:
    """Proposals the scheduler would drop cost a step time (numpy over every sequence): none are made."""
    prompts = _prompts()[:4]
    llm = make_llm(speculative_config={**NGRAM, "disable_by_batch_size": 3})
    runner = llm.llm_engine.worker.runner
    seen: list[int] = []
    real = runner.proposer.propose
    runner.proposer.propose = lambda ids: seen.append(len(runner.batch.requests)) or real(ids)
    outs = _gen(llm, prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    assert seen == [] and sum(o.metrics.num_draft_tokens for o in outs) == 0
    _gen(llm, prompts[:1], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert seen and set(seen) == {1}  # alone, it proposes again


@pytest.mark.parametrize("spec, match", [
    ({"method": "medusa"}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 99}, "num_speculative_tokens"),
    ('{"method": "ngram", ', "JSON"),
    ({"method": "ngram", "bogus": 1}, "speculative_config"),
    ({"method": "draft_model"}, "speculative_config.model"),
])
def test_bad_speculative_config_is_a_typed_error_before_anything_loads(tiny_dir: Path, spec, match) -> None:
    from twinserve.backends.real import LLM

    with pytest.raises(InvalidConfigError, match=match):
        LLM(str(tiny_dir), speculative_config=spec)


def test_the_step_log_records_drafts_and_the_simulator_reads_its_rates(make_llm, tmp_path: Path) -> None:
    from twinserve.backends.real.step_log import read_step_log
    from twinserve.sim.speculative import rates_from_step_log

    prompts = _prompts()[:4]
    refs = [p + o.outputs[0].token_ids for p, o in zip(prompts, _gen(make_llm(), prompts))]
    log = tmp_path / "steps.csv"
    llm = make_llm(speculative_config={**NGRAM, "num_speculative_tokens": 4}, step_log_path=str(log))
    llm.llm_engine.worker.runner.proposer = OracleProposer(refs, 4, miss=3)
    outs = _gen(llm, prompts)
    llm.llm_engine.step_log.close()
    rows = read_step_log(log)
    assert sum(int(r["num_draft_tokens"]) for r in rows) == sum(o.metrics.num_draft_tokens for o in outs)
    assert sum(int(r["num_accepted_tokens"]) for r in rows) == sum(o.metrics.num_accepted_tokens for o in outs)
    rates = rates_from_step_log(log, 4)
    assert len(rates) == 4 and 0.0 < rates[0] < 1.0


@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_drafts_verified_after_a_batch_crossed_disable_by_batch_size_are_fresh(make_llm, policy: str) -> None:
    """Issue 53 item 9: r0 drafts alone, r1 joins (2 running: the runner proposes nothing) and ends, and r0
    drafts again. The oracle drafts plain decoding's continuation without misses, so every fresh draft is
    accepted; a draft kept from before r1 joined is for tokens r0 has since sampled, and is rejected."""
    prompts = _prompts()
    r0, r1 = prompts[3], prompts[4]
    plain = _gen(make_llm(), [r0, r1], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    refs = [p + o.outputs[0].token_ids for p, o in zip([r0, r1], plain)]
    llm = make_llm(batch_policy=policy, engine_core_mode="inproc",
                   speculative_config={**NGRAM, "num_speculative_tokens": 3, "disable_by_batch_size": 2})
    llm.llm_engine.worker.runner.proposer = OracleProposer(refs, 3, miss=10_000)
    eng = llm.llm_engine
    eng.add_request("r0", {"prompt_token_ids": r0}, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    outs = {}
    for _ in range(3):
        for o in eng.step():
            outs[o.request_id] = o
    eng.add_request("r1", {"prompt_token_ids": r1}, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs[o.request_id] = o
    assert outs["r0"].outputs[0].token_ids == plain[0].outputs[0].token_ids
    m = outs["r0"].metrics
    assert m.num_draft_tokens > 6  # drafted before r1 joined and after it left
    assert m.num_accepted_tokens == m.num_draft_tokens
