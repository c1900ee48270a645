"""A stop string inside a run of accepted n-gram drafts, on SmolLM2-135M-Instruct with the real n-gram proposer
(issue 53 item 8): the output keeps one logprob per token it keeps, and they are the tokens' own."""

from __future__ import annotations

import pytest
import torch

from twinserve.backends.real import LLM, SamplingParams

pytestmark = pytest.mark.slow

# The answer repeats the prompt's list, so prompt lookup drafts whole runs the model accepts.
PROMPT = ("Repeat the list: red apple, green pear, yellow banana, purple grape, orange mango. "
          "red apple, green pear, yellow banana, purple grape, orange mango. red apple,")
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def _run(llm: LLM, params: SamplingParams):
    """The output, and the token runs the core handed the engine, step by step."""
    eng = llm.llm_engine
    runs: list[list[int]] = []
    apply = eng._apply

    def record(child, o):
        runs.append(list(o.new_token_ids))
        return apply(child, o)

    eng._apply = record
    try:
        out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    finally:
        eng._apply = apply
    return out, runs


def test_a_stop_string_inside_an_accepted_ngram_run_keeps_one_logprob_per_token() -> None:
    torch.set_num_threads(1)
    llm = LLM("smollm2", max_model_len=512, seed=0, speculative_config=SPEC)
    tok = llm.get_tokenizer()
    full, runs = _run(llm, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1))
    ids = full.token_ids
    assert [lp.token_id for lp in full.logprobs] == ids
    # A stop string that a token in the middle of an accepted run completes, and nothing before it.
    start, cut = 0, None
    for run in runs:
        if len(run) >= 3:
            for j in range(start + 1, start + len(run) - 1):
                stop = tok.decode(ids[j:j + 1])
                if stop.strip() and stop not in tok.decode(ids[:j]) and tok.decode(ids[:j + 1]).endswith(stop):
                    cut = j
                    break
        if cut is not None:
            break
        start += len(run)
    assert cut is not None, f"no accepted run of 3 or more tokens to stop inside: {runs}"
    out, runs = _run(llm, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1,
                                         stop=[stop]))
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == ids[:cut + 1]
    # The core handed over the whole run; the engine kept it up to the stop, and the logprobs with it.
    assert sum(len(r) for r in runs) > len(out.token_ids) and len(runs[-1]) > 1
    assert len(out.logprobs) == len(out.token_ids)
    assert [lp.token_id for lp in out.logprobs] == out.token_ids
    assert [lp.logprob for lp in out.logprobs] == pytest.approx([lp.logprob for lp in full.logprobs[:cut + 1]],
                                                                abs=1e-5)
