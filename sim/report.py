"""Study outputs: tables (CSV; Parquet on request), figures, a Markdown summary."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from twinserve.sim.config import SLOConfig
from twinserve.sim.plots import (config_colors, group_label, plot_cdfs, plot_latency_throughput,
                    plot_replica_load, plot_timeline)
from twinserve.sim.study import PointResult

def write_table(df: pd.DataFrame, path_stem: Path, fmt: str = "csv") -> Path:
    """Write df as CSV (lists joined by ';') or, with fmt 'parquet', Parquet; returns the path.

    CSV is the default whatever is installed: pyarrow arrives with other packages
    (aiconfigurator-core), and a study's file names must not change with them.
    """
    if fmt == "parquet":
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


REPLICA_COLUMNS = ("replica", "hardware", "routed", "completed", "busy_fraction",
                   "mean_kv_usage", "prefix_hit_rate", "preemptions", "p50_ttft_s",
                   "p99_ttft_s", "mean_tpot_s", "p50_e2e_s")


def representative_points(results: Sequence[PointResult], axes: Sequence[str]
                          ) -> tuple[list[PointResult], str]:
    """One point per configuration (at the middle swept rate when rate is an axis) and a caption."""
    with_tables = [r for r in results if not r.requests.empty]
    if "rate" not in axes:
        return with_tables, ""
    rates = sorted({r.row["rate"] for r in with_tables})
    if not rates:
        return [], ""
    rate = rates[(len(rates) - 1) // 2]
    return [r for r in with_tables if r.row["rate"] == rate], f"at rate = {rate} req/s"


def request_accounting(summary: pd.DataFrame) -> str:
    """One line: requests simulated, clipped, dropped or refused, over all points."""
    def total(col: str) -> int:
        return int(summary[col].sum()) if col in summary else 0

    text = (f"requests: {total('num_requests')} simulated over {len(summary)} point(s); "
            f"{total('completed')} completed, {total('overlong_clipped')} clipped to "
            f"max_model_len, {total('overlong_dropped')} dropped as over-long, "
            f"{total('refused')} refused by the engine")
    if total("warmup_requests"):
        text += (f"; {total('warmup_requests')} closed-loop warm-up requests simulated before "
                 "them and left out of the metrics")
    if total("followups_dropped"):
        text += (f"; {total('followups_dropped')} follow-up turns dropped (the conversation "
                 "outgrew max_model_len)")
    if total("requests_short"):
        text += (f"; the trace ran out {total('requests_short')} requests short of "
                 "num_requests (allow_short_trace)")
    return text


def write_study(out_dir: Path, results: Sequence[PointResult], axes: Sequence[str],
                title: str, notes: Sequence[str] = (), fmt: str = "csv",
                slo: SLOConfig | None = None) -> dict[str, Path]:
    """Write summary table, per-point tables, figures and summary.md; returns what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    summary = pd.DataFrame([r.row for r in results])
    written["summary"] = write_table(summary, out_dir / "summary", fmt)
    tables = out_dir / "points"
    tables.mkdir(exist_ok=True)
    for i, r in enumerate(results):
        if not r.requests.empty:
            write_table(r.requests, tables / f"point{i:02d}_requests", fmt)
            write_table(r.steps, tables / f"point{i:02d}_steps", fmt)
        if r.replicas is not None:
            write_table(r.replicas, tables / f"point{i:02d}_replicas", fmt)
    figs = out_dir / "figures"
    figs.mkdir(exist_ok=True)
    colors = config_colors([group_label(r.row, axes) for r in results])
    ttft_slo = slo.ttft_s if slo else None
    tpot_slo = slo.tpot_s if slo else None
    if len(results) > 1 and "request_throughput" in summary:
        written["latency_throughput"] = figs / "latency_throughput.png"
        plot_latency_throughput(summary, axes, written["latency_throughput"], ttft_slo, tpot_slo)
    chosen, caption = representative_points(results, axes)
    label_of = (lambda r: group_label(r.row, axes)) if "rate" in axes else \
        (lambda r: _label(r.row, axes))
    if chosen:
        written["cdf"] = figs / "ttft_tpot_cdf.png"
        plot_cdfs([(label_of(r), r.requests, colors[group_label(r.row, axes)]) for r in chosen],
                  written["cdf"], caption, ttft_slo, tpot_slo)
        # The busiest point shows queueing and KV pressure best.
        busiest = max(chosen, key=lambda r: r.row.get("mean_kv_usage", 0.0))
        steps = busiest.steps
        label = _label(busiest.row, axes)
        if "replica" in steps and steps["replica"].nunique() > 1 and busiest.replicas is not None:
            top = int(busiest.replicas.sort_values("busy_fraction").iloc[-1]["replica"])
            steps = steps[steps["replica"] == top]
            label += f", replica {top}"
        written["timeline"] = figs / "kv_batch_timeline.png"
        plot_timeline(steps, label, written["timeline"])
    clusters = [r for r in chosen if r.replicas is not None]
    if clusters:
        busiest = max(clusters, key=lambda r: r.row.get("mean_kv_usage", 0.0))
        written["replica_load"] = figs / "replica_load.png"
        plot_replica_load([(label_of(r), r.replicas, colors[group_label(r.row, axes)])
                           for r in clusters], busiest.steps, _label(busiest.row, axes),
                          written["replica_load"], caption)
    md = [f"# {title}", ""]
    md += [f"- {n}" for n in notes]
    md.append(f"- {request_accounting(summary)}")
    cluster_cols = tuple(c for c in ("num_replicas", "router", "load_imbalance")
                         if c not in axes) if any(r.replicas is not None for r in results) else ()
    md += ["", markdown_table(summary, [*axes, *cluster_cols, *SUMMARY_COLUMNS]), ""]
    for i, r in enumerate(results):
        if r.replicas is not None and len(results) <= 4:
            md += [f"Replicas of point {i} ({_label(r.row, axes)}):", "",
                   markdown_table(r.replicas, REPLICA_COLUMNS), ""]
    for name in ("latency_throughput", "cdf", "timeline", "replica_load"):
        if name in written:
            md.append(f"![{name}]({written[name].relative_to(out_dir)})")
    md.append("")
    md.append("Tables: `summary.csv` (one row per point), `points/pointNN_requests.csv` "
              "(per request: arrival, queue, TTFT, TPOT, E2E, ITL list, prefix hits, "
              "preemptions, replica; closed loop: client, warmup), `points/pointNN_steps.csv` "
              "(per engine step: batch, queue, KV usage; closed loop: warmup, a step before the "
              "measured window)" + (", `points/pointNN_replicas.csv` (per replica)" if cluster_cols
                             else "")
              + ".")
    written["markdown"] = out_dir / "summary.md"
    written["markdown"].write_text("\n".join(md) + "\n")
    return written
