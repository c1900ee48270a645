"""Token sampling: logit bias, penalties, min_tokens masking, temperature/min-p/top-k/top-p, seeds, logprobs.

Every stage works on the whole batch at once: per-row parameters become one tensor each,
token lists one flat index tensor per stage, so a step launches the same handful of
kernels whatever the batch holds (no per-row generator, reseed or kernel launch).

Random rows draw by inverse CDF: a uniform u per row, the token is the first whose
cumulative probability exceeds u. u comes from a counter-based hash (SplitMix64, Steele
et al., 2014) of (request seed, output position), computed for all rows in one tensor op,
so a request's draws never depend on which other requests share the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from twinserve.core.sampling_params import SamplingParams
from twinserve.core.sched.output import Logprob

_MASK = float("-inf")
_SEED_MOD = 2 ** 63 - 1


class NoTokenAllowedError(ValueError):
    """Every token of a row is masked (e.g. a grammar that allows only EOS while min_tokens forbids it)."""


@dataclass(slots=True)
class SamplingRow:
    """One row of logits to sample from, with what its parameters need."""

    params: SamplingParams
    # Prompt then generated tokens; the first num_prompt_tokens are the prompt.
    token_ids: list[int]
    num_prompt_tokens: int
    base_seed: int
    # Token ids that end generation and must be masked while below min_tokens.
    stop_ids: list[int]

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens


def step_seed(base_seed: int, output_pos: int) -> int:
    """The counter of one draw: a function of the request's seed and position only."""
    return (base_seed * 1_000_003 + output_pos * 7919 + 1) % _SEED_MOD


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors (wrapping arithmetic; logical shifts by masking)."""
    def shr(v: torch.Tensor, s: int) -> torch.Tensor:
        return (v >> s) & ((1 << (64 - s)) - 1)

    x = x + (0x9E3779B97F4A7C15 - (1 << 64))
    x = (x ^ shr(x, 30)) * (0xBF58476D1CE4E5B9 - (1 << 64))
    x = (x ^ shr(x, 27)) * (0x94D049BB133111EB - (1 << 64))
    return x ^ shr(x, 31)


def uniforms(counters: torch.Tensor) -> torch.Tensor:
    """One float64 in [0, 1) per int64 counter, 53 random bits each."""
    return shr53(_mix64(counters)).to(torch.float64) * (2.0 ** -53)


def shr53(x: torch.Tensor) -> torch.Tensor:
    """The top 53 bits of x as a non-negative int64."""
    return (x >> 11) & ((1 << 53) - 1)


class Sampler:
    """Turns fp32 logits [N, V] into one token per row (and logprobs where asked)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]
                 ) -> tuple[list[int], list[Logprob | None]]:
        """Sample every row; returns token ids and per-row logprob records (None if not asked)."""
        params = [r.params for r in rows]
        want_lp = [p.logprobs for p in params]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(n is not None for n in want_lp) else None
        logits = self._apply_penalties_and_masks(logits, rows)
        _check_some_token_allowed(logits, rows)
        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = logits.argmax(dim=-1) if any(greedy) else None
            rand = [i for i, g in enumerate(greedy) if not g]
            sub = rows if len(rand) == len(rows) else [rows[i] for i in rand]
            drawn = self._sample_random(logits if len(rand) == len(rows) else logits[rand], sub)
            if tokens is None:
                tokens = drawn
            else:
                tokens[torch.tensor(rand, device=logits.device)] = drawn
        token_list = tokens.tolist()
        lps: list[Logprob | None] = [None] * len(rows)
        if raw_logprobs is not None:
            asked = [i for i, n in enumerate(want_lp) if n is not None]
            for i, rec in zip(asked, _logprob_records(raw_logprobs[asked], tokens[asked],
                                                      [want_lp[i] or 0 for i in asked])):
                lps[i] = rec
        return token_list, lps

    def processed_logits(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Logits after logit_bias, penalties and the min_tokens mask (greedy takes their argmax)."""
        out = self._apply_penalties_and_masks(logits, rows)
        _check_some_token_allowed(out, rows)
        return out

    def target_probs(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """The float64 distribution each random row draws from, every processor applied."""
        return self.probs(self.processed_logits(logits, rows), rows)

    def _apply_penalties_and_masks(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        # vLLM's order: logit_bias, then penalties (which see the biased logits), then the
        # min_tokens mask (last, so no penalty can lift a masked stop token back).
        bias = [i for i, r in enumerate(rows) if r.params.logit_bias]
        rep = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
        freq = [i for i, r in enumerate(rows) if (r.params.presence_penalty != 0.0
                                                  or r.params.frequency_penalty != 0.0) and r.num_output_tokens]
        mask = [i for i, r in enumerate(rows) if r.stop_ids and r.num_output_tokens < r.params.min_tokens]
        allowed = [i for i, r in enumerate(rows) if r.params.allowed_token_ids]
        if not (bias or rep or freq or mask or allowed):
            return logits
        logits = logits.clone()
        dev, vocab = logits.device, logits.shape[1]
        if bias:
            b = [rows[i].params.logit_bias for i in bias]
            flat = _flat_index(bias, [list(d) for d in b], vocab, dev)
            vals = torch.tensor(list(chain.from_iterable(d.values() for d in b)), dtype=logits.dtype, device=dev)
            logits.view(-1).index_add_(0, flat, vals)
        if rep:
            # CTRL-style (Keskar et al., 2019): seen tokens' logits shrink toward zero.
            seen = torch.zeros((len(rep), vocab), dtype=torch.bool, device=dev)
            seen.view(-1)[_flat_index(range(len(rep)), [rows[i].token_ids for i in rep], vocab, dev)] = True
            pen = torch.tensor([rows[i].params.repetition_penalty for i in rep], dtype=logits.dtype,
                               device=dev).unsqueeze(1)
            idx = torch.tensor(rep, device=dev)
            sub = logits[idx]
            logits[idx] = torch.where(seen, torch.where(sub > 0, sub / pen, sub * pen), sub)
        if freq:
            # OpenAI semantics: over generated tokens only.
            outs = [rows[i].token_ids[rows[i].num_prompt_tokens:] for i in freq]
            counts = torch.zeros((len(freq), vocab), dtype=logits.dtype, device=dev)
            flat = _flat_index(range(len(freq)), outs, vocab, dev)
            counts.view(-1).index_add_(0, flat, torch.ones(flat.shape[0], dtype=logits.dtype, device=dev))
            fp = torch.tensor([rows[i].params.frequency_penalty for i in freq], dtype=logits.dtype, device=dev)
            pp = torch.tensor([rows[i].params.presence_penalty for i in freq], dtype=logits.dtype, device=dev)
            idx = torch.tensor(freq, device=dev)
            logits[idx] -= fp.unsqueeze(1) * counts + pp.unsqueeze(1) * (counts > 0).to(logits.dtype)
        if allowed:
            keep = torch.zeros((len(allowed), vocab), dtype=torch.bool, device=dev)
            keep.view(-1)[_flat_index(range(len(allowed)), [list(rows[i].params.allowed_token_ids or ())
                                                             for i in allowed], vocab, dev)] = True
            idx = torch.tensor(allowed, device=dev)
            logits[idx] = logits[idx].masked_fill(~keep, _MASK)
        if mask:
            logits.view(-1)[_flat_index(mask, [rows[i].stop_ids for i in mask], vocab, dev)] = _MASK
        return logits

    def _sample_random(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        probs = self.probs(logits, rows)
        cdf = probs.cumsum(dim=-1)
        counters = torch.tensor([step_seed(r.base_seed, r.num_output_tokens) for r in rows],
                                dtype=torch.int64, device=logits.device)
        u = (uniforms(counters) * cdf[:, -1]).unsqueeze(1)
        # The first token whose cumulative mass exceeds u; a zero-probability token never is.
        tok = torch.searchsorted(cdf, u, right=True).squeeze(1)
        return tok.clamp_(max=logits.shape[1] - 1)

    def probs(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Processed logits -> the float64 distribution of each random row (temperature, min-p, top-k/p)."""
        dev = logits.device
        ps = [r.params for r in rows]
        # Greedy rows never get here, so every temperature is >= GREEDY_TEMPERATURE (no overflow).
        temps = torch.tensor([p.temperature for p in ps], dtype=logits.dtype, device=dev).unsqueeze(1)
        logits = logits / temps
        min_ps = [p.min_p for p in ps]
        if any(m > 0 for m in min_ps):
            # As vLLM: min-p filters the tempered distribution before top-k/top-p see it.
            probs = torch.softmax(logits, dim=-1)
            mp = torch.tensor(min_ps, dtype=probs.dtype, device=dev).unsqueeze(1)
            logits = logits.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, _MASK)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in ps):
            logits = _top_k_top_p(logits, ps)
        return torch.softmax(logits, dim=-1, dtype=torch.float64)


def _check_some_token_allowed(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """NoTokenAllowedError for a row whose every logit is -inf: drawing from it would pick garbage."""
    dead = (~(~torch.isneginf(logits)).any(dim=1)).nonzero().flatten().tolist()
    if dead:
        r = rows[dead[0]]
        why = (f"the output constraint (or allowed_token_ids) allows only the end of the text, which "
               f"min_tokens={r.params.min_tokens} forbids; lower min_tokens or loosen the constraint"
               if r.num_output_tokens < r.params.min_tokens else
               "the output constraint (or allowed_token_ids) allows no token here")
        raise NoTokenAllowedError(f"no token may come after {r.num_output_tokens} output tokens: {why}")


def _flat_index(row_ids, token_lists: list[list[int]], vocab: int, dev: torch.device) -> torch.Tensor:
    """row * vocab + token for every token of every listed row, as one int64 tensor.

    A token outside [0, vocab) raises IndexError: flattened, it would silently land in a
    neighbouring row, so the failure must stay with the request that carries it (the model
    runner then retries rows alone and ends only that one).
    """
    rows = list(chain.from_iterable([r * vocab] * len(t) for r, t in zip(row_ids, token_lists)))
    toks = list(chain.from_iterable(token_lists))
    if toks and (min(toks) < 0 or max(toks) >= vocab):
        bad = next(t for t in toks if not 0 <= t < vocab)
        raise IndexError(f"token id {bad} is outside the vocabulary [0, {vocab})")
    return torch.tensor(rows, dtype=torch.long, device=dev) + torch.tensor(toks, dtype=torch.long, device=dev)


def _top_k_top_p(logits: torch.Tensor, ps: list[SamplingParams]) -> torch.Tensor:
    dev = logits.device
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    # Clamped in Python: a top_k beyond the vocabulary means "all" and must not overflow a tensor.
    ks = torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in ps], device=dev)
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= ks.unsqueeze(1), _MASK)
    top_ps = torch.tensor([p.top_p for p in ps], device=dev).unsqueeze(1)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the token crossing it stays).
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_ps, _MASK)
    return torch.full_like(logits, _MASK).scatter(1, order, sorted_logits)


def _logprob_records(logprobs: torch.Tensor, tokens: torch.Tensor, top_ns: list[int]) -> list[Logprob]:
    """Chosen token's logprob and rank, and the top N, for every row at once."""
    chosen = logprobs.gather(1, tokens.view(-1, 1))
    ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
    values = chosen.squeeze(1).tolist()
    k = max(top_ns)
    if k > 0:
        top_vals, top_ids = logprobs.topk(k, dim=-1)
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    return [Logprob(t, v, r, list(zip(top_ids[i][:n], top_vals[i][:n])) if n > 0 else [])
            for i, (t, v, r, n) in enumerate(zip(tokens.tolist(), values, ranks, top_ns))]


def prompt_logprob_records(logprobs: torch.Tensor, targets: list[int], top_n: int) -> list[Logprob]:
    """One record per row of logprobs [N, V]: the target token's logprob and rank, and the top N."""
    idx = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
    return _logprob_records(logprobs, idx, [top_n] * len(targets))
