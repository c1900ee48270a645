"""Study outputs: tables (CSV, or Parquet when pyarrow is present), figures, a Markdown summary."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .study import PointResult  # noqa: E402

HAVE_PARQUET = importlib.util.find_spec("pyarrow") is not None


def write_table(df: pd.DataFrame, path_stem: Path, fmt: str = "auto") -> Path:
    """Write df as CSV (lists joined by ';') or Parquet; returns the path written."""
    if fmt == "parquet" or (fmt == "auto" and HAVE_PARQUET):
        path = path_stem.with_suffix(".parquet")
        df.to_parquet(path)
        return path
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object and len(out) and isinstance(out[col].iloc[0], list):
            out[col] = out[col].map(lambda xs: ";".join(f"{x:.6g}" for x in xs))
    path = path_stem.with_suffix(".csv")
    out.to_csv(path, index=False)
    return path


def _label(row: dict[str, Any], axes: Sequence[str]) -> str:
    return ", ".join(f"{a}={row[a]}" for a in axes) if axes else "run"


def plot_latency_throughput(summary: pd.DataFrame, axes: Sequence[str], path: Path) -> None:
    """TTFT and TPOT against achieved throughput, one line per setting of the non-rate axes."""
    group_axes = [a for a in axes if a != "rate"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    groups = summary.groupby(group_axes, sort=False) if group_axes else [((), summary)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{a}={v}" for a, v in zip(group_axes, key)) or "run"
        g = g.sort_values("request_throughput")
        ax1.plot(g["request_throughput"], g["p50_ttft_s"], "o-", label=f"{label} p50")
        ax1.plot(g["request_throughput"], g["p99_ttft_s"], "x--", alpha=0.6, label=f"{label} p99")
        ax2.plot(g["request_throughput"], g["mean_tpot_s"] * 1e3, "o-", label=label)
    ax1.set_xlabel("achieved throughput (req/s)")
    ax1.set_ylabel("TTFT (s)")
    ax1.set_yscale("log")
    ax1.set_title("time to first token")
    ax2.set_xlabel("achieved throughput (req/s)")
    ax2.set_ylabel("mean TPOT (ms)")
    ax2.set_title("time per output token")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cdfs(points: Sequence[tuple[str, pd.DataFrame]], path: Path) -> None:
    """Empirical CDFs of TTFT and TPOT, one line per point."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, req in points:
        for ax, col in ((ax1, "ttft_s"), (ax2, "tpot_s")):
            v = req[col].dropna().sort_values().to_numpy()
            if len(v):
                ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)
    ax1.set_xscale("log")
    ax1.set_xlabel("TTFT (s)")
    ax2.set_xlabel("TPOT (s)")
    for ax in (ax1, ax2):
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(steps: pd.DataFrame, label: str, path: Path) -> None:
    """KV usage, batch size and queue length over simulated time for one point."""
    fig, ax1 = plt.subplots(figsize=(11, 3.8))
    if not steps.empty:
        ax1.plot(steps["start_s"], steps["kv_usage"] * 100, lw=0.8, color="C0", label="KV usage %")
        ax2 = ax1.twinx()
        ax2.plot(steps["start_s"], steps["batch_size"], lw=0.6, color="C1", label="batch size")
        ax2.plot(steps["start_s"], steps["num_waiting"], lw=0.6, color="C3", label="waiting")
        ax2.set_ylabel("requests")
        ax2.legend(loc="upper right", fontsize=8)
    ax1.set_xlabel("simulated time (s)")
    ax1.set_ylabel("KV usage (%)")
    ax1.set_title(f"engine load over time ({label})")
    ax1.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown_table(df: pd.DataFrame, columns: Sequence[str]) -> str:
    """A small Markdown table of chosen columns."""
    cols = [c for c in columns if c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_fmt(row[c]) for c in cols) + " |")
    return "\n".join(lines)


SUMMARY_COLUMNS = ("completed", "request_throughput", "output_throughput", "goodput",
                   "p50_ttft_s", "p99_ttft_s", "mean_tpot_s", "p99_tpot_s", "p99_itl_s",
                   "p50_e2e_s", "preemptions", "prefix_hit_rate", "mean_kv_usage", "mfu", "mbu")


def write_study(out_dir: Path, results: Sequence[PointResult], axes: Sequence[str],
                title: str, notes: Sequence[str] = (), fmt: str = "auto") -> dict[str, Path]:
    """Write summary table, per-point tables, figures and summary.md; returns what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    summary = pd.DataFrame([r.row for r in results])
    written["summary"] = write_table(summary, out_dir / "summary", fmt)
    tables = out_dir / "points"
    tables.mkdir(exist_ok=True)
    labelled = []
    for i, r in enumerate(results):
        label = _label(r.row, axes)
        if not r.requests.empty:
            write_table(r.requests, tables / f"point{i:02d}_requests", fmt)
            write_table(r.steps, tables / f"point{i:02d}_steps", fmt)
        labelled.append((label, r))
    figs = out_dir / "figures"
    figs.mkdir(exist_ok=True)
    if len(results) > 1 and "request_throughput" in summary:
        written["latency_throughput"] = figs / "latency_throughput.png"
        plot_latency_throughput(summary, axes, written["latency_throughput"])
    with_tables = [(lab, r) for lab, r in labelled if not r.requests.empty]
    if with_tables:
        step = max(1, len(with_tables) // 8)
        written["cdf"] = figs / "ttft_tpot_cdf.png"
        plot_cdfs([(lab, r.requests) for lab, r in with_tables[::step]], written["cdf"])
        # The busiest point shows queueing and KV pressure best.
        lab, busiest = max(with_tables, key=lambda x: x[1].row.get("mean_kv_usage", 0.0))
        written["timeline"] = figs / "kv_batch_timeline.png"
        plot_timeline(busiest.steps, lab, written["timeline"])
    md = [f"# {title}", ""]
    md += [f"- {n}" for n in notes]
    md += ["", markdown_table(summary, [*axes, *SUMMARY_COLUMNS]), ""]
    for name in ("latency_throughput", "cdf", "timeline"):
        if name in written:
            md.append(f"![{name}]({written[name].relative_to(out_dir)})")
    md.append("")
    md.append("Tables: `summary.csv` (one row per point), `points/pointNN_requests.csv` "
              "(per request: arrival, queue, TTFT, TPOT, E2E, ITL list, prefix hits, "
              "preemptions), `points/pointNN_steps.csv` (per engine step: batch, queue, KV usage).")
    written["markdown"] = out_dir / "summary.md"
    written["markdown"].write_text("\n".join(md) + "\n")
    return written
