"""Measured vs predicted: latency percentiles, per-request errors, throughput, a table and a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from twinserve.sim.world import RequestRecord

METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 99)


def per_request(records: Sequence[RequestRecord]) -> dict[str, dict[str, float]]:
    """request id -> {ttft, tpot, itl (mean), e2e} for finished requests."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        if r.finish_time is None or r.first_token_time is None:
            continue
        n = r.num_output_tokens
        tt = r.token_times
        gaps = [b - a for a, b in zip(tt, tt[1:])]
        out[r.request_id] = {
            "ttft": r.first_token_time - r.arrival_time,
            "tpot": (r.finish_time - r.first_token_time) / (n - 1) if n > 1 else float("nan"),
            "itl": float(np.mean(gaps)) if gaps else float("nan"),
            "e2e": r.finish_time - r.arrival_time,
        }
    return out


def pooled(records: Sequence[RequestRecord], metric: str) -> np.ndarray:
    """Every value of metric (ITL: every gap between two tokens; else one per request)."""
    if metric == "itl":
        vals = [b - a for r in records if r.finish_time is not None
                for a, b in zip(r.token_times, r.token_times[1:])]
        return np.asarray(vals, dtype=float)
    vals = [v[metric] for v in per_request(records).values()]
    arr = np.asarray(vals, dtype=float)
    return arr[~np.isnan(arr)]


def _throughput(records: Sequence[RequestRecord]) -> dict[str, float]:
    done = [r for r in records if r.finish_time is not None]
    if not done:
        return {"output_tok_s": float("nan"), "request_s": float("nan"), "duration_s": 0.0}
    start = min(r.arrival_time for r in records)
    end = max(r.finish_time for r in done)
    dur = end - start
    return {"output_tok_s": sum(r.num_output_tokens for r in done) / dur,
            "request_s": len(done) / dur, "duration_s": dur}


def _err(sim: float, real: float) -> float:
    return (sim - real) / real if real else float("nan")


def compare(real: Sequence[RequestRecord], sim: Sequence[RequestRecord]) -> dict[str, Any]:
    """The fidelity.json 'metrics' and 'throughput' sections."""
    out: dict[str, Any] = {"metrics": {}}
    real_req, sim_req = per_request(real), per_request(sim)
    common = sorted(set(real_req) & set(sim_req))
    for m in METRICS:
        r_vals, s_vals = pooled(real, m), pooled(sim, m)
        entry: dict[str, Any] = {}
        for p in PERCENTILES:
            rv = float(np.percentile(r_vals, p)) if len(r_vals) else float("nan")
            sv = float(np.percentile(s_vals, p)) if len(s_vals) else float("nan")
            entry[f"p{p}"] = {"real": rv, "sim": sv, "err": _err(sv, rv)}
        errs = [abs(_err(sim_req[i][m], real_req[i][m])) for i in common
                if not np.isnan(real_req[i][m]) and real_req[i][m] > 0]
        entry["per_request_median_abs_err"] = float(np.median(errs)) if errs else float("nan")
        out["metrics"][m] = entry
    rt, st = _throughput(real), _throughput(sim)
    out["throughput"] = {k: {"real": rt[k], "sim": st[k], "err": _err(st[k], rt[k])}
                         for k in ("output_tok_s", "request_s")}
    out["num_requests_compared"] = len(common)
    return out


# The twin's targets: TTFT, TPOT and E2E within 5% at p50 and within 10% at p99 (issue 9).
TARGET_METRICS = ("ttft", "tpot", "e2e")
DEFAULT_TARGETS = {"p50": 0.05, "p99": 0.10}


def targets(metrics: dict[str, Any], limits: dict[str, float] | None = None,
            real_spread: dict[str, dict[str, float]] | None = None, judged_on: str = "the run") -> dict[str, Any]:
    """Which of the target cells (TARGET_METRICS x limits' percentiles) the prediction meets.

    real_spread (fidelity --repeats: the largest |error| of a later real run against the first,
    per metric and percentile) marks each cell whose error lies within what the real engine
    repeats itself to: a miss there is not one a model could have avoided on this machine.
    """
    limits = dict(limits or DEFAULT_TARGETS)
    cells: dict[str, dict[str, Any]] = {}
    for m in TARGET_METRICS:
        for q, lim in limits.items():
            err = float(metrics[m][q]["err"])
            cell: dict[str, Any] = {"err": err, "limit": lim, "met": bool(abs(err) <= lim)}
            if real_spread is not None:
                cell["real_spread"] = real_spread[m][q]
                cell["within_real_spread"] = bool(abs(err) <= real_spread[m][q])
            cells.setdefault(m, {})[q] = cell
    flat = [c for per in cells.values() for c in per.values()]
    out = {"limits": limits, "judged_on": judged_on, "cells": cells,
           "met": sum(c["met"] for c in flat), "of": len(flat)}
    if real_spread is not None:
        out["within_real_spread"] = sum(c["within_real_spread"] for c in flat)
    return out


def target_line(t: dict[str, Any]) -> str:
    """One line: how many target cells the prediction met, and the misses."""
    lims = ", ".join(f"{v:.0%} at {q}" for q, v in t["limits"].items())
    missed = [f"{m.upper()} {q} {c['err']:+.1%}"
              + (f" (real runs {c['real_spread']:.1%} apart)" if "real_spread" in c else "")
              for m, per in t["cells"].items() for q, c in per.items() if not c["met"]]
    line = (f"targets (|error| within {lims} for TTFT, TPOT and E2E; {t['judged_on']}): "
            f"{t['met']} of {t['of']} met")
    if "within_real_spread" in t:
        line += f", {t['within_real_spread']} of {t['of']} within the real runs' own spread"
    return line + (f"; missed: {', '.join(missed)}" if missed else "")


def table(report: dict[str, Any]) -> str:
    """A markdown table of the comparison."""
    lines = ["| metric | p50 real | p50 sim | p50 err | p90 real | p90 sim | p90 err | p99 real "
             "| p99 sim | p99 err | per-request median abs err |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in METRICS:
        e = report["metrics"][m]
        cells = [m]
        for p in PERCENTILES:
            x = e[f"p{p}"]
            cells += [f"{x['real']:.4f}", f"{x['sim']:.4f}", f"{x['err']:+.1%}"]
        cells.append(f"{e['per_request_median_abs_err']:.1%}")
        lines.append("| " + " | ".join(cells) + " |")
    t = report["throughput"]
    lines.append("")
    lines.append(f"throughput: real {t['output_tok_s']['real']:.2f} output tok/s, sim "
                 f"{t['output_tok_s']['sim']:.2f} ({t['output_tok_s']['err']:+.1%}); "
                 f"requests/s real {t['request_s']['real']:.3f}, sim {t['request_s']['sim']:.3f} "
                 f"({t['request_s']['err']:+.1%})")
    return "\n".join(lines)


def figure(real: Sequence[RequestRecord], sim: Sequence[RequestRecord], path: Path,
           title: str = "", other_real: Sequence[Sequence[RequestRecord]] = ()) -> Path:
    """CDFs of TTFT, TPOT, ITL, E2E (measured vs predicted) and a per-request scatter.

    other_real: later real runs of the same workload, drawn thin beside the first: how far
    the real engine lands from itself.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(22, 4.2))
    for ax, m in zip(axes, METRICS):
        for j, recs in enumerate(other_real):
            v = np.sort(pooled(recs, m))
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), "-", color="0.6", lw=1,
                        label="real engine, other runs" if j == 0 else None)
        for recs, label, style in ((real, "real engine", "-"), (sim, "simulator", "--")):
            v = np.sort(pooled(recs, m))
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), style, label=label, lw=2)
        ax.set_xlabel(f"{m.upper()} (s)")
        ax.set_ylabel("fraction of " + ("tokens" if m == "itl" else "requests"))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    ax = axes[4]
    rr, sr = per_request(real), per_request(sim)
    common = sorted(set(rr) & set(sr))
    for m, color in (("ttft", "tab:blue"), ("e2e", "tab:orange")):
        x = [rr[i][m] for i in common]
        y = [sr[i][m] for i in common]
        ax.scatter(x, y, s=12, alpha=0.7, color=color, label=m.upper())
    lim = max([1e-3] + [rr[i]["e2e"] for i in common] + [sr[i]["e2e"] for i in common])
    ax.plot([0, lim], [0, lim], "k:", lw=1, label="y = x")
    ax.set_xlabel("real (s)")
    ax.set_ylabel("simulated (s)")
    ax.set_title("per request")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
