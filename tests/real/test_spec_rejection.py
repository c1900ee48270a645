"""Speculative sampling keeps the target distribution: chi-square tests over >= 20,000 draws.

The acceptance function is tested directly (fast), then through verify_drafts with the
sampler's processors (temperature, top-k, logit_bias, penalties) against plain sampling.
A planted bug, accepting drafts without the ratio test, must fail the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from twinserve.backends.real.sampler import Sampler, SamplingRow
from twinserve.backends.real.spec.ngram import NgramProposer
from twinserve.backends.real.spec.rejection import accept_greedy, rejection_sample
from twinserve.backends.real.spec.verify import VerifyEntry, verify_drafts
from twinserve.core.sampling_params import SamplingParams

N = 20_000
V = 6
ALPHA = 0.01


def _p_value(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square (homogeneity) over the tokens seen."""
    ca, cb = np.bincount(a, minlength=V), np.bincount(b, minlength=V)
    keep = (ca + cb) > 0
    return float(chi2_contingency(np.stack([ca[keep], cb[keep]]))[1])


def _targets(seed: int, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(k + 1, V, generator=g, dtype=torch.float64) * 1.5, dim=-1)


def _spec_tokens(p: torch.Tensor, drafts_for, draft_probs, rng: np.random.Generator, planted: bool = False
                 ) -> tuple[list[int], list[int]]:
    """Tokens at positions 0 and 1 over N verified drafts (position 1 only where it was reached)."""
    k = p.shape[0] - 1
    first, second = [], []
    for _ in range(N):
        drafts = drafts_for(rng)
        u_acc = [0.0] * k if planted else rng.random(k).tolist()
        out = rejection_sample(p, drafts, u_acc, rng.random(k + 1).tolist(), draft_probs)
        first.append(out[0])
        if len(out) > 1:
            second.append(out[1])
    return first, second


def _plain(p: torch.Tensor, j: int, rng: np.random.Generator, n: int) -> list[int]:
    return rng.choice(V, size=n, p=p[j].numpy()).tolist()


def test_deterministic_drafts_keep_the_target_distribution_and_a_planted_bug_does_not():
    p = _targets(0, 3)
    drafts = [int(p[j].argmax()) for j in range(3)]  # an n-gram proposer's drafts are fixed
    rng = np.random.default_rng(1)
    first, second = _spec_tokens(p, lambda r: drafts, None, rng)
    assert _p_value(first, _plain(p, 0, rng, N)) > ALPHA
    assert _p_value(second, _plain(p, 1, rng, N)) > ALPHA
    assert len(second) > N // 4  # position 1 was reached often enough to be tested
    bad_first, _ = _spec_tokens(p, lambda r: drafts, None, rng, planted=True)
    assert _p_value(bad_first, _plain(p, 0, rng, N)) < ALPHA


def test_draft_model_drafts_keep_the_target_distribution_and_a_planted_bug_does_not():
    p = _targets(2, 2)
    q = _targets(3, 1)  # the draft model's own distributions at positions 0 and 1
    rng = np.random.default_rng(4)

    def sample_drafts(r: np.random.Generator) -> list[int]:
        return [int(r.choice(V, p=q[j].numpy())) for j in range(2)]

    first, second = _spec_tokens(p, sample_drafts, q, rng)
    assert _p_value(first, _plain(p, 0, rng, N)) > ALPHA
    assert _p_value(second, _plain(p, 1, rng, N)) > ALPHA
    bad_first, _ = _spec_tokens(p, sample_drafts, q, rng, planted=True)
    assert _p_value(bad_first, _plain(p, 0, rng, N)) < ALPHA


def _rows(params: SamplingParams, n: int, ctx: list[int], seed0: int = 0) -> list[SamplingRow]:
    return [SamplingRow(params, list(ctx), 1, seed0 + i, [0]) for i in range(n)]


def test_verify_honours_the_sampler_processors_against_plain_sampling():
    # Temperature, top-k, logit_bias and a repetition penalty all shape the target; the
    # second position's context includes the first draft, which the penalty must see.
    params = SamplingParams(temperature=0.8, top_k=4, logit_bias={2: 1.5}, repetition_penalty=1.3,
                            max_tokens=10)
    g = torch.Generator().manual_seed(5)
    base = torch.randn(2, V, generator=g, dtype=torch.float64)
    ctx = [1, 4]
    drafts = [3]
    sampler = Sampler(torch.device("cpu"))
    n = N
    rows = _rows(params, n, ctx)
    logits = base.repeat(n, 1)  # rows 2i, 2i+1: positions 0 and 1 of entry i
    out = verify_drafts(sampler, logits, [VerifyEntry(r, drafts) for r in rows])
    first = [o[0] for o in out]
    second = [o[1] for o in out if len(o) > 1]
    # Independent seeds for the plain draws (the same seed would reuse the same uniforms).
    plain_first = sampler(base[:1].repeat(n, 1), _rows(params, n, ctx, seed0=n))[0]
    plain_second = sampler(base[1:].repeat(n, 1), _rows(params, n, ctx + drafts, seed0=2 * n))[0]
    assert _p_value(first, plain_first) > ALPHA
    assert _p_value(second, plain_second) > ALPHA
    # The penalty changes position 1's distribution: scoring it without the draft in the
    # context would be told apart.
    wrong = sampler(base[1:].repeat(n, 1), _rows(params, n, ctx, seed0=3 * n))[0]
    assert _p_value(wrong, plain_second) < ALPHA


def test_greedy_acceptance_takes_the_matching_prefix_and_one_target_token():
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]
    assert accept_greedy([5, 9, 7, 8], [5, 6, 7]) == [5, 9]
    assert accept_greedy([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert accept_greedy([4], []) == [4]


def test_ngram_proposer_continues_the_first_earlier_match_of_the_longest_suffix():
    prop = NgramProposer(3, 1, 3)
    seq = np.array([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 2, 3, 4])
    assert prop.propose(seq) == [5, 9, 2]  # "2 3 4" first followed by 5 9 2
    assert prop.propose(np.array([1, 2, 3, 1])) == [2, 3, 1]
    assert prop.propose(np.array([1, 2, 3, 4])) == []
    assert NgramProposer(2, 2, 2).propose(np.array([1, 2, 3, 1])) == []  # no 2-gram recurs
    assert prop.propose(np.array([7])) == []



def _draft_model_pipeline(bug: str | None = None) -> tuple[list[int], list[int]]:
    """N requests drafted by the draft model's own sampling (q != one-hot), then verify_drafts:
    the first output tokens, and plain sampling's. bug plants one: 'no-ratio' accepts every draft,
    'shifted-q' hands verification q of the other position."""
    from twinserve.backends.real.input_batch import CachedRequestState
    from twinserve.backends.real.spec import verify
    from twinserve.backends.real.spec.draft_model import DraftModelProposer, DraftWork

    params = SamplingParams(temperature=0.9, top_k=5, logit_bias={1: 0.7}, max_tokens=10)
    g = torch.Generator().manual_seed(11)
    target = torch.randn(3, V, generator=g, dtype=torch.float64) * 1.5
    draft = torch.randn(2, V, generator=g, dtype=torch.float64) * 1.5  # the draft model's logits
    ctx = [1, 4]
    sampler = Sampler(torch.device("cpu"))
    proposer = DraftModelProposer(None, None, torch.device("cpu"), 4, 2, sampler)  # type: ignore[arg-type]
    rows = _rows(params, N, ctx)
    live = [DraftWork(CachedRequestState(str(i), i, ctx, 1, params, 0, 0, r.base_seed), 0, 0, 2, r)
            for i, r in enumerate(rows)]
    drafts: dict[str, list[int]] = {w.st.req_id: [] for w in live}
    q: dict[str, list[torch.Tensor]] = {w.st.req_id: [] for w in live}
    for j in range(2):
        for w, t in zip(live, proposer._sample(draft[j:j + 1].repeat(N, 1), live, drafts, q)):
            drafts[w.st.req_id].append(t)
    entries = [VerifyEntry(r, drafts[str(i)], torch.stack(q[str(i)][::-1] if bug == "shifted-q" else q[str(i)]))
               for i, r in enumerate(rows)]
    sample = verify.rejection_sample
    if bug == "no-ratio":
        verify.rejection_sample = lambda p, d, u_acc, u_draw, dp: sample(p, d, [0.0] * len(d), u_draw, dp)
    try:
        out = verify_drafts(sampler, target.repeat(N, 1), entries)
    finally:
        verify.rejection_sample = sample
    plain_first = sampler(target[:1].repeat(N, 1), _rows(params, N, ctx, seed0=N))[0]
    return [o[0] for o in out], plain_first


def test_draft_model_sampling_through_verify_keeps_the_target_distribution():
    first, plain_first = _draft_model_pipeline()
    assert _p_value(first, plain_first) > ALPHA


@pytest.mark.parametrize("bug", ["no-ratio", "shifted-q"])
def test_a_planted_bug_in_draft_model_verification_is_told_apart(bug: str):
    first, plain_first = _draft_model_pipeline(bug)
    assert _p_value(first, plain_first) < ALPHA


def _bonus_tokens(p: torch.Tensor, q: torch.Tensor, rng: np.random.Generator, sample=rejection_sample) -> list[int]:
    """The token after a fully accepted draft (the bonus), over N draft-model verifications."""
    k = q.shape[0]
    bonus = []
    for _ in range(N):
        drafts = [int(rng.choice(V, p=q[j].numpy())) for j in range(k)]
        out = sample(p, drafts, rng.random(k).tolist(), rng.random(k + 1).tolist(), q)
        if len(out) == k + 1:
            bonus.append(out[k])
    return bonus


def test_the_token_after_a_fully_accepted_draft_follows_the_target_and_a_bonus_from_q_does_not():
    p = _targets(7, 2)
    # A draft model close to the target: most drafts are accepted whole.
    q = (0.8 * p[:2] + 0.2 * _targets(8, 1)).contiguous()
    rng = np.random.default_rng(9)
    bonus = _bonus_tokens(p, q, rng)
    assert len(bonus) > N // 3
    assert _p_value(bonus, _plain(p, 2, rng, N)) > ALPHA

    def bonus_from_q(p_, drafts, u_acc, u_draw, q_):  # the planted bug: the bonus drawn from the draft's q
        out = rejection_sample(p_, drafts, u_acc, u_draw, q_)
        if len(out) == len(drafts) + 1:
            out[-1] = int(rng.choice(V, p=q_[-1].numpy()))
        return out

    bad = _bonus_tokens(p, q, rng, bonus_from_q)
    assert _p_value(bad, _plain(p, 2, rng, N)) < ALPHA


def test_the_bonus_after_a_fully_accepted_draft_is_the_targets_token_exactly_through_verify():
    """Issue 53 item 10, exact: the target is certain at every position (one-hot after softmax), the draft's q is
    not and puts no mass on the target's bonus token. Every draft is accepted (q(x) <= p(x) = 1), so every
    output is the drafts then the target's bonus; a bonus drawn from q (or from the last draft row) never is."""
    k, n, bonus = 3, 200, 5
    params = SamplingParams(temperature=0.8, max_tokens=10)
    drafts = [2, 0, 3]
    target = torch.full((k + 1, V), -1e4, dtype=torch.float64)
    for j, t in enumerate(drafts + [bonus]):
        target[j, t] = 0.0
    q = torch.full((k, V), 0.0, dtype=torch.float64)
    for j, d in enumerate(drafts):
        q[j] = 0.5 / (V - 2)
        q[j, d] = 0.5
        q[j, bonus] = 0.0
    assert float(torch.softmax(target[k] / 0.8, -1)[bonus]) == 1.0 and float(q[k - 1, bonus]) == 0.0
    sampler = Sampler(torch.device("cpu"))
    rows = _rows(params, n, [1, 4])
    entries = [VerifyEntry(r, drafts, q if i % 2 else None) for i, r in enumerate(rows)]
    out = verify_drafts(sampler, target.repeat(n, 1), entries)
    assert out == [drafts + [bonus]] * n
