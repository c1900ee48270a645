"""The batched sampler: one set of tensor ops per step, results as the per-row definitions say."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twinserve.backends.real.sampler import Sampler, SamplingRow, uniforms
from twinserve.core.sampling_params import SamplingParams

_M = (1 << 64) - 1
VOCAB = 24


def _splitmix64(x: int) -> int:
    """Reference SplitMix64 finaliser on Python ints (Steele et al., 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def test_tensor_hash_equals_the_integer_reference() -> None:
    counters = [0, 1, 12345, 2 ** 62 + 7, 2 ** 63 - 2]
    got = uniforms(torch.tensor(counters, dtype=torch.int64)).tolist()
    assert got == [(_splitmix64(c) >> 11) * 2.0 ** -53 for c in counters]


def test_draws_follow_the_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 8) * 1.5
    probs = torch.softmax(logits, -1)[0].double()
    n = 20_000
    rows = [SamplingRow(SamplingParams(temperature=1.0), [1, 2], 1, seed, []) for seed in range(n)]
    tokens, _ = Sampler(torch.device("cpu"))(logits.expand(n, 8).contiguous(), rows)
    freq = torch.bincount(torch.tensor(tokens), minlength=8).double() / n
    # 4 standard deviations of a binomial share at n = 20,000 is below 0.015.
    assert (freq - probs).abs().max() < 0.015


def _reference_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The per-row definitions, one row at a time."""
    out = logits.clone()
    for row, r in zip(out, rows):
        p = r.params
        if p.logit_bias:
            for t, b in p.logit_bias.items():
                row[t] += b
        prompt, output = r.token_ids[:r.num_prompt_tokens], r.token_ids[r.num_prompt_tokens:]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompt) | set(output)))
            v = row[seen]
            row[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if output:
            c = torch.bincount(torch.tensor(output), minlength=VOCAB).to(row.dtype)
            row -= p.frequency_penalty * c + p.presence_penalty * (c > 0).to(row.dtype)
        if r.stop_ids and len(output) < p.min_tokens:
            row[r.stop_ids] = float("-inf")
    return out


_row = st.builds(
    lambda prompt, output, rep, pres, freq, bias, min_tokens, stops: SamplingRow(
        SamplingParams(temperature=0, repetition_penalty=rep, presence_penalty=pres, frequency_penalty=freq,
                       min_tokens=min_tokens, max_tokens=64, logit_bias=bias or None),
        prompt + output, len(prompt), 0, stops),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), st.lists(st.integers(0, VOCAB - 1), max_size=6),
    st.sampled_from([1.0, 0.7, 1.3]), st.sampled_from([0.0, 0.5, -1.0]), st.sampled_from([0.0, 0.7, -0.3]),
    st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-5, 5), max_size=3), st.integers(0, 4),
    st.lists(st.integers(0, VOCAB - 1), max_size=2, unique=True))


@settings(max_examples=60, deadline=None)
@given(st.lists(_row, min_size=1, max_size=5), st.integers(0, 2 ** 31))
def test_batched_penalties_equal_the_per_row_definitions(rows: list[SamplingRow], seed: int) -> None:
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(seed))
    got = Sampler(torch.device("cpu"))._apply_penalties_and_masks(logits, rows)
    assert torch.allclose(got, _reference_penalties(logits, rows), atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0.3, 2.0), st.integers(0, 8), st.sampled_from([1.0, 0.9, 0.5]),
                          st.sampled_from([0.0, 0.05]), st.integers(0, 10 ** 9)), min_size=2, max_size=6))
def test_each_row_draws_the_same_token_alone_as_in_any_batch(specs) -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(len(specs), 50, generator=torch.Generator().manual_seed(len(specs)))
    rows = [SamplingRow(SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m), [1, 2, 3], 2, s, [])
            for t, k, p, m, s in specs]
    together, _ = sampler(logits, rows)
    alone = [sampler(logits[i:i + 1], [r])[0][0] for i, r in enumerate(rows)]
    assert together == alone
    for i, (_, k, _, _, _) in enumerate(specs):
        if k:
            assert together[i] in logits[i].topk(k).indices.tolist()


def test_a_token_id_outside_the_vocabulary_fails_its_batch_instead_of_hitting_a_neighbour() -> None:
    # Flattened, row 0's stop id VOCAB + 3 would be row 1's token 3: the batch must fail (the model
    # runner then retries rows alone) rather than silently mask the other request's best token.
    sampler = Sampler(torch.device("cpu"))
    logits = torch.zeros(2, VOCAB)
    logits[1, 3] = 5.0
    bad = SamplingRow(SamplingParams(temperature=0, min_tokens=2), [1], 1, 0, [VOCAB + 3])
    good = SamplingRow(SamplingParams(temperature=0), [1], 1, 0, [0])
    with pytest.raises(IndexError, match="outside the vocabulary"):
        sampler(logits, [bad, good])
    with pytest.raises(IndexError):
        sampler(logits[:1], [bad])
    assert sampler(logits[1:], [good])[0] == [3]
    negative = SamplingRow(SamplingParams(temperature=0, logit_bias={1: 1.0}), [1], 1, 0, [])
    negative.params.logit_bias = {-1: 50.0}  # past validation: would land on row 0's last token
    with pytest.raises(IndexError):
        sampler(logits, [good, negative])
