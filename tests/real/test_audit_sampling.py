"""Sampling and streaming edges that a planted bug once slipped past (docs/test-audit.md)."""

from __future__ import annotations

import torch

from twinserve.backends.real import SamplingParams
from twinserve.backends.real.sampler import Sampler, SamplingRow

from .conftest import prompts_ids
from ..limits import bounded


def test_top_p_reached_exactly_keeps_only_the_tokens_that_reach_it() -> None:
    # Two equal logits: each token has probability exactly 0.5 (no rounding). top_p=0.5 is reached by the
    # first token alone, so the second must never be drawn ("the smallest set whose mass reaches top_p").
    sampler = Sampler(torch.device("cpu"))
    logits = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]])
    drawn = set()
    for seed in range(64):
        sp = SamplingParams(temperature=1.0, top_p=0.5, seed=seed)
        toks, _ = sampler(logits, [SamplingRow(sp, [1, 2], 2, seed, [])])
        drawn.add(toks[0])
    assert len(drawn) == 1, drawn
    # Just above 0.5 both are needed to reach it, and both are drawn.
    both = set()
    for seed in range(64):
        sp = SamplingParams(temperature=1.0, top_p=0.51, seed=seed)
        toks, _ = sampler(logits, [SamplingRow(sp, [1, 2], 2, seed, [])])
        both.add(toks[0])
    assert both == {0, 1}


def test_streamed_deltas_never_show_a_longer_stop_string_beside_a_shorter_one(make_llm) -> None:
    # Two stop strings of different lengths: while streaming, the text that could still start the LONGER one
    # is held back. Deltas must add up to the final text (which ends before the stop string), never more.
    llm = make_llm()
    engine = llm.llm_engine
    prompt = prompts_ids(1, seed=23)[0]
    tok = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    full_out = llm.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)[0].outputs[0]
    full = full_out.text
    # Character offsets where each token's text starts: a stop beginning mid-token spans tokens.
    starts = {len(tok.decode(full_out.token_ids[:i])) for i in range(len(full_out.token_ids))}
    short = next(c for c in "~^|#@" if c not in full)
    spanning = 0
    for k, begin in enumerate(range(3, len(full) - 6, 3)):
        stop = full[begin:begin + 5]
        if full.index(stop) != begin:
            continue
        spanning += any(begin < s < begin + 5 for s in starts)
        sp = greedy.clone(stop=[short, stop])
        engine.add_request(f"hb{k}", {"prompt_token_ids": prompt}, sp)
        text, final = "", None
        for _ in bounded():
            if not engine.has_unfinished_requests():
                break
            for out in engine.step():
                text += out.outputs[0].text_delta
                final = out
        assert final is not None and final.finished
        c = final.outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason == stop
        assert c.text == full[:begin]
        assert text == c.text, (stop, text)
    assert spanning > 0  # some stop string did arrive over several tokens


def test_each_request_gets_its_own_number_of_top_logprobs_in_a_shared_batch(make_llm) -> None:
    # Requests asking for different numbers of top logprobs share every step's batch.
    llm = make_llm()
    prompts = prompts_ids(3, seed=24)
    asks = [1, 5, 0]
    params = [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=n) for n in asks]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for n, out in zip(asks, outs):
        c = out.outputs[0]
        assert c.logprobs is not None and len(c.logprobs) == 4
        assert all(len(lp.top) == n for lp in c.logprobs), (n, [len(lp.top) for lp in c.logprobs])


def test_a_seeded_request_draws_afresh_at_every_position() -> None:
    # Flat logits over 256 tokens: 48 positions of one seeded request draw many different tokens. The same
    # uniform at every position (a counter that forgets the position) would draw one token 48 times.
    sampler = Sampler(torch.device("cpu"))
    logits = torch.zeros(1, 256)
    sp = SamplingParams(temperature=1.0, seed=11)
    drawn = []
    for pos in range(48):
        toks, _ = sampler(logits, [SamplingRow(sp, [1, 2] + [3] * pos, 2, 11, [])])
        drawn.append(toks[0])
    assert len(set(drawn)) >= 30, drawn
    again = [sampler(logits, [SamplingRow(sp, [1, 2] + [3] * pos, 2, 11, [])])[0][0] for pos in range(48)]
    assert again == drawn  # and the seed reproduces them


def test_a_sampled_tokens_logprob_is_its_own_not_the_best_ones(make_llm) -> None:
    # Greedy picks the best token, so its logprob and the best one's agree; random draws often pick another.
    llm = make_llm()
    sp = SamplingParams(temperature=1.5, seed=3, max_tokens=30, ignore_eos=True, logprobs=5)
    c = llm.generate([{"prompt_token_ids": prompts_ids(1, seed=25)[0]}], sp, use_tqdm=False)[0].outputs[0]
    assert c.logprobs is not None and [lp.token_id for lp in c.logprobs] == c.token_ids
    below_best = 0
    for lp in c.logprobs:
        top = dict(lp.top)
        assert lp.rank == 1 + sum(v > lp.logprob for v in top.values()) or lp.rank > len(top)
        if lp.token_id in top:
            assert lp.logprob == top[lp.token_id]
        else:
            assert lp.logprob < min(top.values()) and lp.rank > len(top)
        below_best += lp.rank > 1
    assert below_best > 0  # some draws were not the best token
