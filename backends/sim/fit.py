"""Fitting a step profile: non-negative least squares on relative error, with diagnostics.

Device path (execute_s) and CPU overhead (step_time_s - execute_s) are fitted over the same
regressors; coefficients stay >= 0 (NNLS; Lawson & Hanson 1974) so no term buys fit on one step
kind at another's expense. Residuals are divided by the *fitted* time (IRLS; McCullagh & Nelder,
GLMs, 1989, ch. 8): dividing by the measured time biases the fit under the mean, and the
simulator sums step times, so it needs the mean (docs/twin-log.md).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from twinserve.backends.sim.fitted import (COEFFICIENTS, FEATURE_COLUMNS, RANGE_DIMS, ZERO, FittedCostModel, ProfileError,
                     Regime, attention_window, design_row, regime_order, shape_measures)
from twinserve.backends.sim.cost_model import windowed_features

# Rows whose relative residual lies this many robust standard deviations off are refitted without.
OUTLIER_SIGMAS = 5.0
# Reweighting rounds at most, and the largest change of a weight (relative) that ends them.
IRLS_ROUNDS = 10
IRLS_TOL = 1e-4


def _outlier_bounds(rel: np.ndarray) -> tuple[float, float]:
    """(median, limit): errors farther than limit from the median are far outliers (robust MAD)."""
    med = float(np.median(rel))
    return med, OUTLIER_SIGMAS * max(float(np.median(np.abs(rel - med))) * 1.4826, 1e-3)


def _nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """min ||w·(x β - y)|| with β >= 0; columns scaled for conditioning, all-zero columns give 0."""
    from scipy.optimize import nnls

    xw = x * w[:, None]
    scale = np.abs(xw).max(axis=0)
    scale[scale == 0] = 1.0
    beta, _ = nnls(xw / scale, y * w, maxiter=50 * x.shape[1])
    return beta / scale


STEP_KINDS = ("prefill", "decode", "mixed")


def step_kind(pt: float, ds: float) -> str:
    """A step's kind from its prefill tokens and decode sequences (the fit's per-kind diagnostics)."""
    if pt and ds:
        return "mixed"
    return "prefill" if pt else "decode"


def _used(x: np.ndarray) -> int:
    """Coefficients a set of steps' design rows use (columns not all zero)."""
    return int((np.abs(x).max(axis=0) > 0).sum())


def _fit_bucket(x: np.ndarray, total: np.ndarray, execute: np.ndarray | None,
                name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(device coefs, overhead coefs, kept-row mask) for one set of steps."""
    used = _used(x)
    if len(total) < max(used, 2):
        raise ProfileError(f"{name}: {len(total)} steps cannot fit {used} coefficients; "
                           "log more steps (fewer steps than coefficients)")
    keep = np.ones(len(total), dtype=bool)
    for _ in range(2):
        # Weights from measured, then fitted times until settled. Far outliers are weighed down
        # as Huber's loss does (Huber 1964): one slow compile step would otherwise dominate.
        w = 1.0 / total[keep]
        for _ in range(IRLS_ROUNDS):
            if execute is None:
                dev, ovh = _nnls(x[keep], total[keep], w), np.zeros(x.shape[1])
            else:
                dev = _nnls(x[keep], execute[keep], w)
                ovh = _nnls(x[keep], np.maximum(total[keep] - execute[keep], 0.0), w)
            # Floor the price at a tenth of the time so 1/price stays bounded.
            pred = np.maximum(x[keep] @ (dev + ovh), 0.1 * total[keep])
            r = total[keep] / pred - 1.0
            _, limit = _outlier_bounds(r)
            w_next = np.sqrt(np.minimum(1.0, limit / np.maximum(np.abs(r), 1e-12))) / pred
            settled = np.max(np.abs(w_next / w - 1.0)) < IRLS_TOL
            w = w_next
            if settled:
                break
        rel = (x @ (dev + ovh) - total) / total
        med, limit = _outlier_bounds(rel[keep])
        outliers = np.abs(rel - med) > limit
        # Refit once without far outliers, and only when they are few.
        if not outliers.any() or outliers.sum() > 0.05 * len(total) or not keep.all():
            break
        keep = ~outliers
    return dev, ovh, keep


def fit_step_profile(rows: Iterable[Mapping[str, Any]], *, split: bool = True,
                     regime_max_tokens: Sequence[int] = (), graph_max_decodes: int | None = None,
                     time_key: str = "step_time_s", execute_key: str = "execute_s",
                     **meta: Any) -> FittedCostModel:
    """Fit a profile to step-log rows (features, step_time_s and, to split, execute_s).

    graph_max_decodes: pure-decode batches up to this size replay CUDA graphs and get their own
    decode_only regime; regime_max_tokens then split the eager steps only. A meta "attention"
    record (fitted.attention_window) fits sliding layers' attention terms capped at the window.
    """
    window, share = attention_window(meta)
    data = []
    for i, row in enumerate(rows):
        for col in FEATURE_COLUMNS + (time_key,):
            if col not in row:
                raise ProfileError(f"step {i}: the step log has no column {col!r}")
        f = [float(row[c]) for c in FEATURE_COLUMNS]
        if f[0] + f[4] <= 0:
            continue  # a step that computed nothing says nothing about cost
        t = float(row[time_key])
        if not t > 0:
            raise ProfileError(f"step {i}: {time_key} must be > 0, got {row[time_key]!r}")
        # Requests also wait through the driver's gap between steps: part of the overhead.
        t += float(row.get("gap_s") or 0.0)
        e = float(row[execute_key]) if split and execute_key in row else None
        data.append((f, t, e))
    if len(data) < len(COEFFICIENTS):
        raise ProfileError(f"need at least {len(COEFFICIENTS)} steps that computed tokens to fit "
                           f"{len(COEFFICIENTS)} coefficients, got {len(data)}")
    split = split and all(e is not None for _, _, e in data)
    feats = np.array([f for f, _, _ in data])
    x = np.array([design_row(*windowed_features(window, share, *f)) for f, _, _ in data])
    total = np.array([t for _, t, _ in data])
    execute = np.array([e for _, _, e in data]) if split else None
    tokens = feats[:, 0] + feats[:, 4]

    bounds = sorted(set(int(b) for b in regime_max_tokens))
    bucket = np.full(len(data), len(bounds))
    for j in reversed(range(len(bounds))):
        bucket[tokens <= bounds[j]] = j
    keep = np.ones(len(data), dtype=bool)
    regimes: list[Regime] = []
    if graph_max_decodes:
        graph = (feats[:, 0] == 0) & (feats[:, 4] <= graph_max_decodes)
        bucket[graph] = -1
        if graph.any():
            dev, ovh, kept = _fit_bucket(x[graph], total[graph], execute[graph] if execute is not None else None,
                                         f"decode steps of <= {graph_max_decodes} sequences (CUDA graphs)")
            keep[np.flatnonzero(graph)[~kept]] = False
            regimes.append(Regime(int(graph_max_decodes), tuple(map(float, dev)), tuple(map(float, ovh)),
                                  decode_only=True))
    # A regime holding too few steps to fit its coefficients (a short calibration where a code path's bound
    # cuts off a handful of steps) is priced with the next regime's: its steps join that one.
    for j in range(len(bounds)):
        m = bucket == j
        if m.any() and m.sum() < max(_used(x[m]), 2):
            bucket[m] = j + 1
    coefs: list[tuple[np.ndarray, np.ndarray]] = []
    for j in range(len(bounds) + 1):
        m = bucket == j
        name = f"steps of <= {bounds[j]} tokens" if j < len(bounds) else "steps"
        if j < len(bounds) and not m.any():
            coefs.append((np.zeros(len(COEFFICIENTS)), np.zeros(len(COEFFICIENTS))))
            continue
        dev, ovh, kept = _fit_bucket(x[m], total[m], execute[m] if execute is not None else None,
                                     name)
        keep[np.flatnonzero(m)[~kept]] = False
        coefs.append((dev, ovh))

    dev_default, ovh_default = coefs[-1]
    regimes += [Regime(bounds[j], tuple(map(float, coefs[j][0])), tuple(map(float, coefs[j][1])))
                for j in range(len(bounds)) if (bucket == j).any()]
    model = FittedCostModel(*(float(c) for c in dev_default), meta=dict(meta),
                            overhead=tuple(map(float, ovh_default)) if split else ZERO,
                            regimes=sorted(regimes, key=regime_order), sliding_window=window,
                            sliding_share=share)
    model.meta["fit"] = diagnostics(model, feats, total, execute, keep)
    return model


def select_regimes(rows: list[Mapping[str, Any]], base: Sequence[int] = (),
                   candidates: Sequence[int] = (), min_steps: int = 24, gain: float = 0.1,
                   **fit_kwargs: Any) -> list[int]:
    """Token-count breakpoints that make the fit clearly better, chosen greedily.

    CPU GEMM kernels change with the row count, so one line in tokens can miss whole batch ranges.
    A breakpoint is kept if it cuts mean relative error by `gain`, each regime keeping `min_steps`.
    """
    rows = list(rows)
    graph_max = fit_kwargs.get("graph_max_decodes") or 0
    # Steps a CUDA-graph regime prices are not split by token counts.
    tokens = np.array([float(r["num_prefill_tokens"]) + float(r["num_decode_seqs"]) for r in rows
                       if float(r["num_prefill_tokens"]) or float(r["num_decode_seqs"]) > graph_max])
    chosen = sorted(set(int(b) for b in base))

    def score(bounds: list[int]) -> float:
        edges = [0] + bounds + [float("inf")]
        if any(((tokens > lo) & (tokens <= hi)).sum() < min_steps for lo, hi in zip(edges, edges[1:])):
            return float("inf")
        try:
            return fit_step_profile(rows, regime_max_tokens=bounds, **fit_kwargs).meta["fit"]["mape"]
        except ProfileError:
            return float("inf")

    best = score(chosen)
    while True:
        trials = [(score(sorted(chosen + [c])), c) for c in candidates if c not in chosen]
        if not trials:
            return chosen
        err, c = min(trials)
        # Not `err > ...`: with every score infinite, stop rather than take each candidate.
        if not err < best * (1 - gain):
            return chosen
        chosen, best = sorted(chosen + [c]), err


def shape_range(feats: np.ndarray) -> dict[str, float]:
    """The largest step the fit saw, per RANGE_DIMS measure (fitted.shape_measures)."""
    if not len(feats):
        return {}
    m = np.array([shape_measures(*f) for f in feats])
    return {d: float(v) for d, v in zip(RANGE_DIMS, m.max(axis=0))}


def _total_err(pred: np.ndarray, total: np.ndarray) -> float | None:
    """Summed price over summed measured time - 1 (None without steps)."""
    return float(pred.sum() / total.sum() - 1.0) if len(total) else None


def diagnostics(model: FittedCostModel, feats: np.ndarray, total: np.ndarray,
                execute: np.ndarray | None, kept: np.ndarray | None = None) -> dict[str, Any]:
    """Fit errors overall and per step kind, and the range of step shapes fitted."""
    pred = np.array([model.step_time(*f) for f in feats])
    rel = (pred - total) / total
    med, limit = _outlier_bounds(rel)
    typical = np.abs(rel - med) <= limit
    ss_res = float(((total - pred) ** 2).sum())
    ss_tot = float(((total - total.mean()) ** 2).sum()) or 1.0
    out: dict[str, Any] = {
        "num_steps": int(len(total)),
        "num_outliers_dropped": int((~kept).sum()) if kept is not None else 0,
        "r2": 1.0 - ss_res / ss_tot,
        "mape": float(np.mean(np.abs(rel))),
        # Summed price / summed time - 1 over typical steps: one far outlier (a compile) would
        # otherwise outweigh hundreds of steps in the sum.
        "total_err": _total_err(pred[typical], total[typical]),
        "total_err_steps": int(typical.sum()),
        "p95_abs_rel_err": float(np.percentile(np.abs(rel), 95)),
        "by_kind": {},
    }
    out["range"] = shape_range(feats)
    kinds = np.array([step_kind(f[0], f[4]) for f in feats])
    for k in STEP_KINDS:
        m = kinds == k
        if m.any():
            r = rel[m]
            worst = int(np.argmax(np.abs(r)))
            out["by_kind"][k] = {"num_steps": int(m.sum()), "mape": float(np.mean(np.abs(r))),
                                 "worst_rel_err": float(r[worst]),
                                 "total_err": _total_err(pred[m & typical], total[m & typical]),
                                 "mean_step_s": float(total[m].mean())}
    if execute is not None:
        dev = np.array([model.split(*f)[0] for f in feats])
        out["execute_mape"] = float(np.mean(np.abs(dev - execute) / execute))
        out["overhead_share"] = float(np.mean((total - execute) / total))
    return out


def fit_profile(rows: Iterable[Mapping[str, float]], time_key: str = "step_time_s",
                **meta: Any) -> FittedCostModel:
    """One-part fit of step times (no overhead split), kept for logs without execute_s."""
    return fit_step_profile(rows, split=False, time_key=time_key, **meta)
