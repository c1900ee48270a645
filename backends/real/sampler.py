"""Token sampling: logit bias, penalties, min_tokens masking, temperature/min-p/top-k/top-p, seeds, logprobs.

Random rows draw with the exponential race (argmax of p / E, E ~ Exp(1)), which picks token
i with probability p_i; the noise comes from a generator seeded by (request seed, output
position), so a request's draws never depend on which other requests share the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.sampling_params import SamplingParams
from ...core.sched.output import Logprob

_MASK = float("-inf")
_SEED_MOD = 2 ** 63 - 1


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
    """The generator seed of one draw: a function of the request's seed and position only."""
    return (base_seed * 1_000_003 + output_pos * 7919 + 1) % _SEED_MOD


class Sampler:
    """Turns fp32 logits [N, V] into one token per row (and logprobs where asked)."""

    def __init__(self, device: torch.device) -> None:
        self.generator = torch.Generator(device=device)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]
                 ) -> tuple[list[int], list[Logprob | None]]:
        """Sample every row; returns token ids and per-row logprob records (None if not asked)."""
        want_lp = [r.params.logprobs is not None for r in rows]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_lp) else None
        logits = self._apply_penalties_and_masks(logits, rows)
        greedy_rows = [i for i, r in enumerate(rows) if r.params.greedy]
        random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        if greedy_rows:
            idx = torch.tensor(greedy_rows, device=logits.device)
            tokens[idx] = logits[idx].argmax(dim=-1)
        if random_rows:
            idx = torch.tensor(random_rows, device=logits.device)
            tokens[idx] = self._sample_random(logits[idx], [rows[i] for i in random_rows])
        token_list = tokens.tolist()
        lps: list[Logprob | None] = [None] * len(rows)
        if raw_logprobs is not None:
            for i, r in enumerate(rows):
                if want_lp[i]:
                    lps[i] = _logprob_record(raw_logprobs[i], token_list[i], r.params.logprobs or 0)
        return token_list, lps

    def _apply_penalties_and_masks(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        # vLLM's order: logit_bias, then penalties (which see the biased logits), then the
        # min_tokens mask (last, so no penalty can lift a masked stop token back).
        cloned = False
        for i, r in enumerate(rows):
            p = r.params
            needs_pen = (p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                         or p.frequency_penalty != 0.0)
            needs_mask = r.num_output_tokens < p.min_tokens and r.stop_ids
            if not (needs_pen or needs_mask or p.logit_bias):
                continue
            if not cloned:
                logits, cloned = logits.clone(), True
            row = logits[i]
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), dtype=torch.long, device=row.device)
                row.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), dtype=row.dtype,
                                                    device=row.device))
            if needs_pen:
                _apply_penalties(row, p, r.token_ids[:r.num_prompt_tokens], r.token_ids[r.num_prompt_tokens:])
            if needs_mask:
                row[torch.tensor(r.stop_ids, device=row.device)] = _MASK
        return logits

    def _sample_random(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        dev = logits.device
        # Greedy rows never get here, so every temperature is >= GREEDY_TEMPERATURE (no overflow).
        temps = torch.tensor([r.params.temperature for r in rows], dtype=logits.dtype, device=dev).unsqueeze(1)
        logits = logits / temps
        min_ps = [r.params.min_p for r in rows]
        if any(m > 0 for m in min_ps):
            # As vLLM: min-p filters the tempered distribution before top-k/top-p see it.
            probs = torch.softmax(logits, dim=-1)
            mp = torch.tensor(min_ps, dtype=probs.dtype, device=dev).unsqueeze(1)
            logits = logits.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, _MASK)
        if any(r.params.top_k > 0 or r.params.top_p < 1.0 for r in rows):
            logits = _top_k_top_p(logits, rows)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs)
        g = self.generator
        for i, r in enumerate(rows):
            g.manual_seed(step_seed(r.base_seed, r.num_output_tokens))
            noise[i].exponential_(generator=g)
        return (probs / noise).argmax(dim=-1)


def _apply_penalties(row: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> None:
    dev = row.device
    if p.repetition_penalty != 1.0:
        # CTRL-style (Keskar et al., 2019): seen tokens' logits shrink toward zero.
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long, device=dev)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if output and (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0):
        # OpenAI semantics: over generated tokens only.
        counts = torch.bincount(torch.tensor(output, device=dev), minlength=row.shape[0]).to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def _top_k_top_p(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    dev = logits.device
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    # Clamped in Python: a top_k beyond the vocabulary means "all" and must not overflow a tensor.
    ks = torch.tensor([min(r.params.top_k, vocab) if r.params.top_k > 0 else vocab for r in rows], device=dev)
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)
    drop = ranks >= ks.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, _MASK)
    top_ps = torch.tensor([r.params.top_p for r in rows], device=dev).unsqueeze(1)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the token crossing it stays).
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_ps, _MASK)
    return torch.full_like(logits, _MASK).scatter(1, order, sorted_logits)


def _logprob_record(logprobs: torch.Tensor, token: int, top_n: int) -> Logprob:
    lp = logprobs[token]
    rank = int((logprobs > lp).sum().item()) + 1
    top: list[tuple[int, float]] = []
    if top_n > 0:
        vals, ids = logprobs.topk(top_n)
        top = list(zip(ids.tolist(), vals.tolist()))
    return Logprob(token, float(lp.item()), rank, top)


def prompt_logprob_records(logprobs: torch.Tensor, targets: list[int], top_n: int) -> list[Logprob]:
    """One record per row of logprobs [N, V]: the target token's logprob and rank, and the top N."""
    idx = torch.tensor(targets, dtype=torch.long, device=logprobs.device).unsqueeze(1)
    chosen = logprobs.gather(1, idx)
    ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
    values = chosen.squeeze(1).tolist()
    if top_n > 0:
        top_vals, top_ids = logprobs.topk(top_n, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
    else:
        tops = [[] for _ in targets]
    return [Logprob(t, v, r, top) for t, v, r, top in zip(targets, values, ranks, tops)]
