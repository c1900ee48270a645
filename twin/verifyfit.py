"""A profile's verify term: what a speculative verify row costs beyond decode rows at its context.

The step log records a verify row as a (k' + 1)-token chunk at context c. A profile with the term
prices it as k' + 1 decode rows at c (the same matmul rows, each attending to the context; the
base fit measures decode rows well), plus seconds per verify row and per draft token for what that
misses (the acceptance test, the rows' causal attention to each other), and seconds per step that
verifies (the verify path's fixed cost). The three are fitted by non-negative least squares to the residuals relative to that price (relative to the measured time the fit would fall
under the mean, and the simulator sums step times, so it needs the mean: backends/sim/fit.py).
Only steps whose every chunk is a verify row are used; the base fit never sees a verify step.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from twinserve.backends.sim.fitted import FEATURE_COLUMNS, FittedCostModel


def is_verify(row: Mapping[str, Any]) -> bool:
    """Whether a step-log row verified drafts."""
    return int(float(row.get("num_draft_tokens") or 0)) > 0


def is_pure_verify(row: Mapping[str, Any]) -> bool:
    """A step that verified drafts and prefilled nothing else (every chunk a verify row)."""
    return is_verify(row) and int(float(row["num_prefill_seqs"])) == int(float(row.get("num_spec_reqs") or 0))


def as_decode(row: Mapping[str, Any]) -> tuple[float, ...]:
    """A pure verify step's features: each verify row of q tokens at context c as q decode rows at c."""
    chunks = row.get("prefill_chunks")
    if isinstance(chunks, str):
        chunks = json.loads(chunks)
    qc = (sum(float(q) * float(c) for q, c in chunks) if chunks
          else float(row["num_prefill_tokens"]) * float(row["prefill_context"]) / max(float(row["num_prefill_seqs"]), 1.0))
    return (0.0, 0.0, 0.0, 0.0, float(row["num_decode_seqs"]) + float(row["num_prefill_tokens"]),
            float(row["decode_context"]) + qc)


def _arrays(profile: FittedCostModel, rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, ...]:
    """(measured s, price as decode rows s, [verify rows, draft tokens]) of pure verify steps."""
    measured = np.array([float(r["step_time_s"]) + float(r.get("gap_s") or 0.0) for r in rows])
    base = np.array([profile.step_time(*as_decode(r)) for r in rows])
    x = np.array([[1.0, float(r.get("num_spec_reqs") or 0), float(r.get("num_draft_tokens") or 0)] for r in rows])
    return measured, base, x.reshape(len(rows), 3)


def solve_verify(profile: FittedCostModel, rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, float]:
    """(per verify step, per verify row, per draft token) seconds minimising the error of base + term
    relative to the base price."""
    measured, base, x = _arrays(profile, rows)
    if len(rows) < 3:
        return 0.0, 0.0, 0.0
    from scipy.optimize import nnls

    # Non-negative (Lawson & Hanson 1974): on a noisy machine an unconstrained pair trades sign
    # between rows and drafts and can price a large verify step below its decode rows.
    w = 1.0 / np.maximum(base, 1e-9)
    xw = x * w[:, None]
    scale = np.maximum(np.abs(xw).max(axis=0), 1e-12)
    beta, _ = nnls(xw / scale, (measured - base) * w)
    beta = beta / scale
    return float(beta[0]), float(beta[1]), float(beta[2])


def verify_errors(profile: FittedCostModel, rows: Sequence[Mapping[str, Any]],
                  term: tuple[float, float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(priced, measured) seconds of the rows with the given term (None: the profile's)."""
    measured, base, x = _arrays(profile, rows)
    t = term if term is not None else (profile.per_verify_step_s, profile.per_verify_seq_s, profile.per_draft_token_s)
    return np.maximum(base + x @ np.array(t) * profile.time_scale, 0.0), measured


def _point(row: Mapping[str, Any]) -> tuple[int, int, int]:
    """The design point a verify step came from: its verify rows, plain decodes, and the verify rows'
    mean context to 64 tokens."""
    n = max(int(float(row.get("num_spec_reqs") or 0)), 1)
    return n, int(float(row["num_decode_seqs"])), int(round(float(row["prefill_context"]) / n / 64.0))


def _as_prefill(profile: FittedCostModel, rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(priced, measured) seconds of the rows priced as the prefill chunks they are logged as."""
    measured = np.array([float(r["step_time_s"]) + float(r.get("gap_s") or 0.0) for r in rows])
    return np.array([profile.step_time(*(float(r[c]) for c in FEATURE_COLUMNS)) for r in rows]), measured


def _summary(priced_measured: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """Per-step relative errors, and the error of the steps' total time (what a simulation sums)."""
    priced, measured = priced_measured
    err = priced / measured - 1.0
    return {"num_steps": int(err.size), "mape": float(np.mean(np.abs(err))), "median_err": float(np.median(err)),
            "total_err": float(priced.sum() / measured.sum() - 1.0)}


def fit_verify_term(profile: FittedCostModel, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Set the profile's verify term from the verify rows; its diagnostics, held-out points included.

    Held out: every other design point (verify rows x context), fitted on the rest and priced on them.
    """
    rows = [r for r in rows if is_pure_verify(r)]
    if not rows:
        return {"num_steps": 0}
    points = sorted({_point(r) for r in rows})
    out: dict[str, Any] = {"num_steps": len(rows), "points": len(points),
                           "as_prefill": _summary(_as_prefill(profile, rows)),
                           "without_term": _summary(verify_errors(profile, rows, (0.0, 0.0, 0.0)))}
    if len(points) >= 2:
        held = set(points[1::2])
        train = [r for r in rows if _point(r) not in held]
        test = [r for r in rows if _point(r) in held]
        term = solve_verify(profile, train)
        out["held_out"] = {"points": [list(p) for p in sorted(held)], "term": list(term),
                           **_summary(verify_errors(profile, test, term)),
                           "as_prefill": _summary(_as_prefill(profile, test))}
    profile.per_verify_step_s, profile.per_verify_seq_s, profile.per_draft_token_s = solve_verify(profile, rows)
    profile.verify_fitted = True
    out["in_sample"] = _summary(verify_errors(profile, rows))
    return out
