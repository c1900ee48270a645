"""Draft verification: exact for greedy, rejection sampling otherwise.

Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023: accept x_j with probability
min(1, p_j(x_j) / q_j(x_j)), else draw from norm(max(0, p_j - q_j)), so outputs follow p exactly.
A proposer without probabilities (n-gram) has q_j one-hot at x_j.
"""

from __future__ import annotations

import torch


def accept_greedy(targets: list[int], drafts: list[int]) -> list[int]:
    """The accepted drafts, then the target's own token at the first mismatch (or the bonus).

    targets[j] is the greedy token after the context plus drafts[:j] (len(drafts) + 1 of them).
    """
    out: list[int] = []
    for j, d in enumerate(drafts):
        t = targets[j]
        out.append(t)
        if t != d:
            return out
    out.append(targets[len(drafts)])
    return out


def _draw(probs: torch.Tensor, u: float) -> int:
    cdf = probs.cumsum(0)
    tok = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype), right=True)[0])
    return min(tok, probs.shape[0] - 1)


def rejection_sample(target_probs: torch.Tensor, drafts: list[int], u_accept: list[float],
                     u_draw: list[float], draft_probs: torch.Tensor | None = None) -> list[int]:
    """The output tokens of one verified draft: accepted drafts then one drawn token.

    target_probs: [k + 1, V] (row j is p after the context plus drafts[:j]); draft_probs:
    [k, V] or None for a deterministic proposer; u_accept: k uniforms, u_draw: k + 1.
    """
    k = len(drafts)
    for j in range(k):
        d = drafts[j]
        p = float(target_probs[j, d])
        q = 1.0 if draft_probs is None else float(draft_probs[j, d])
        if u_accept[j] * q < p:  # u < min(1, p / q), without dividing by a zero q
            continue
        if draft_probs is None:
            residual = target_probs[j].clone()
            residual[d] = 0.0
        else:
            residual = (target_probs[j] - draft_probs[j]).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q: rejection had probability 0; rounding got here
            residual = target_probs[j]
        return drafts[:j] + [_draw(residual, u_draw[j])]
    return drafts + [_draw(target_probs[k], u_draw[k])]
