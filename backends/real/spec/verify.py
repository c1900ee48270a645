"""One verify step for the model runner: each request's k + 1 logits rows become its output tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from twinserve.backends.real.sampler import Sampler, SamplingRow, step_seed, uniforms
from twinserve.backends.real.spec.rejection import accept_greedy, rejection_sample

# Keeps the acceptance uniforms' counters apart from the draws' (which plain sampling shares).
_ACCEPT_SALT = 0x5DEECE66D


@dataclass(slots=True)
class VerifyEntry:
    """A request whose step verified drafts: its sampling row (context before the drafts), drafts and q."""

    row: SamplingRow
    drafts: list[int]
    # The draft model's q [len(drafts), V] for a random row; None for a deterministic proposer.
    draft_probs: torch.Tensor | None = None


def verify_drafts(sampler: Sampler, logits: torch.Tensor, entries: list[VerifyEntry]) -> list[list[int]]:
    """Output tokens per entry; logits holds len(drafts) + 1 consecutive rows per entry.

    Row j of an entry is scored as plain sampling would score the context plus drafts[:j]
    (penalties, logit_bias, min_tokens and the seed's position all see those tokens), so a
    greedy request gets the tokens it would get without speculation, up to rounding: the k + 1
    rows come from one batched forward, so top-two near-ties can break the other way
    (docs/speculative.md, "The limit of token-identical").
    """
    rows: list[SamplingRow] = []
    for e in entries:
        r = e.row
        for j in range(len(e.drafts) + 1):
            ctx = r.token_ids + e.drafts[:j] if j else r.token_ids
            rows.append(SamplingRow(r.params, ctx, r.num_prompt_tokens, r.base_seed, r.stop_ids))
    processed = sampler.processed_logits(logits, rows)
    greedy = [e.row.params.greedy for e in entries]
    targets = processed.argmax(dim=-1).tolist() if any(greedy) else []
    rand_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    probs = sampler.probs(processed[rand_rows], [rows[i] for i in rand_rows]) if rand_rows else None
    out: list[list[int]] = []
    offset = rand_offset = 0
    for e, g in zip(entries, greedy):
        n = len(e.drafts) + 1
        if g:
            out.append(accept_greedy(targets[offset:offset + n], e.drafts))
        else:
            assert probs is not None
            r = e.row
            pos = [r.num_output_tokens + j for j in range(n)]
            draw = uniforms(torch.tensor([step_seed(r.base_seed, p) for p in pos], dtype=torch.int64)).tolist()
            acc = uniforms(torch.tensor([step_seed(r.base_seed ^ _ACCEPT_SALT, p) for p in pos[:-1]],
                                        dtype=torch.int64)).tolist()
            out.append(rejection_sample(probs[rand_offset:rand_offset + n].cpu(), e.drafts, acc, draw,
                                        e.draft_probs))
            rand_offset += n
        offset += n
    return out
