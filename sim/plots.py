"""Study figures: one colour per configuration across every panel, p50 solid and p99 dashed, SLOs drawn.

A configuration is a setting of the sweep axes other than the request rate; the rate is
the x axis (through the achieved throughput) of the latency panels.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

P50 = dict(ls="-", marker="o", ms=4, lw=1.6)
P99 = dict(ls="--", marker="x", ms=4, lw=1.2, alpha=0.85)
SLO = dict(color="0.35", ls=":", lw=1.2)


def config_colors(labels: Sequence[str]) -> dict[str, tuple]:
    """A distinct colour per configuration label, stable in the order given."""
    uniq = list(dict.fromkeys(labels))
    cmap = plt.get_cmap("tab10" if len(uniq) <= 10 else "tab20")
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(uniq)}


def group_label(row: pd.Series | dict, axes: Sequence[str]) -> str:
    """The configuration a summary row belongs to (its non-rate axes)."""
    keys = [a for a in axes if a != "rate"]
    return ", ".join(f"{a}={row[a]}" for a in keys) if keys else "run"


def _legend_below(fig, ax, handles=None, labels=None) -> None:
    h, lab = ax.get_legend_handles_labels() if handles is None else (handles, labels)
    if h:
        ncol = len(h) if len(h) <= 4 else 3
        fig.legend(h, lab, loc="lower center", ncol=ncol, fontsize=8, frameon=False)


def plot_latency_throughput(summary: pd.DataFrame, axes: Sequence[str], path,
                            ttft_slo: float | None = None, tpot_slo: float | None = None) -> None:
    """TTFT and TPOT (p50 solid, p99 dashed, same colour) against achieved throughput."""
    labels = [group_label(r, axes) for _, r in summary.iterrows()]
    colors = config_colors(labels)
    df = summary.assign(_cfg=labels)
    n = len(colors)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6 + 0.25 * ((n + 2) // 3)))
    for lab, g in df.groupby("_cfg", sort=False):
        g = g.sort_values("request_throughput")
        c = colors[lab]
        x = g["request_throughput"]
        ax1.plot(x, g["p50_ttft_s"], color=c, label=lab, **P50)
        ax1.plot(x, g["p99_ttft_s"], color=c, **P99)
        ax2.plot(x, g["p50_tpot_s"] * 1e3, color=c, **P50)
        ax2.plot(x, g["p99_tpot_s"] * 1e3, color=c, **P99)
    if ttft_slo:
        ax1.axhline(ttft_slo, **SLO)
        ax1.annotate(f"SLO {ttft_slo:g} s", (0.01, ttft_slo), xycoords=("axes fraction", "data"),
                     fontsize=7, color="0.35", va="bottom")
    if tpot_slo:
        ax2.axhline(tpot_slo * 1e3, **SLO)
        ax2.annotate(f"SLO {tpot_slo * 1e3:g} ms", (0.99, tpot_slo * 1e3), ha="right",
                     xycoords=("axes fraction", "data"), fontsize=7, color="0.35", va="bottom")
    ax1.set_yscale("log")
    ax1.set_ylabel("TTFT (s, log)")
    ax1.set_title("time to first token")
    ax2.set_ylabel("TPOT (ms)")
    ax2.set_title("time per output token")
    for ax in (ax1, ax2):
        ax.set_xlabel("achieved throughput (req/s)")
        ax.grid(alpha=0.3)
    # Line styles explained once; colours once, below both panels.
    style = [plt.Line2D([], [], color="k", **P50), plt.Line2D([], [], color="k", **P99)]
    ax2.legend(style, ["p50", "p99"], fontsize=8, loc="upper left")
    h, lab = ax1.get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.06 + 0.05 * ((n - 1) // 3), 1, 1))
    _legend_below(fig, ax1, h, lab)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cdfs(points: Sequence[tuple[str, pd.DataFrame, tuple]], path, title: str = "",
              ttft_slo: float | None = None, tpot_slo: float | None = None) -> None:
    """Empirical CDFs of TTFT and TPOT, one colour per configuration, legend below."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6 + 0.25 * ((len(points) + 2) // 3)))
    # Past five lines, styles cycle too, so curves that coincide stay visible.
    styles = ("-", "--", ":") if len(points) > 5 else ("-",)
    for j, (label, req, color) in enumerate(points):
        if "warmup" in req.columns:  # closed loop: the metrics leave warm-up requests out
            req = req[~req["warmup"].astype(bool)]
        for ax, col in ((ax1, "ttft_s"), (ax2, "tpot_s")):
            v = np.sort(req[col].dropna().to_numpy(dtype=float))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=color, lw=1.4,
                        ls=styles[j % len(styles)], label=label if ax is ax1 else None)
    for ax, slo in ((ax1, ttft_slo), (ax2, tpot_slo)):
        if not slo:
            continue
        lo, hi = ax.get_xlim()
        if slo <= hi * 3:
            ax.axvline(slo, **SLO)
            ax.annotate(f"SLO {slo:g} s", (slo, 0.02), xycoords=("data", "axes fraction"),
                        fontsize=7, color="0.35", rotation=90, ha="right")
        else:  # far right of every request: say so instead of squeezing the curves
            ax.annotate(f"SLO {slo:g} s →", (0.99, 0.02), xycoords="axes fraction",
                        fontsize=7, color="0.35", ha="right")
    ax1.set_xscale("log")
    ax1.set_xlabel("TTFT (s, log)")
    ax2.set_xscale("log")
    ax2.set_xlabel("TPOT (s, log)")
    for ax in (ax1, ax2):
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.005)
        for q in (0.5, 0.99):
            ax.axhline(q, color="0.8", lw=0.8, zorder=0)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.05 * ((len(points) - 1) // 3), 1, 1))
    _legend_below(fig, ax1)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(steps: pd.DataFrame, label: str, path) -> None:
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


def plot_replica_load(points: Sequence[tuple[str, pd.DataFrame, tuple]],
                      busiest_steps: pd.DataFrame, busiest_label: str, path,
                      caption: str = "") -> None:
    """Per replica: share of requests routed, busy fraction, prefix hit rate; load over time."""
    fig = plt.figure(figsize=(12, 7.2))
    gs = fig.add_gridspec(2, 3, height_ratios=(1, 1))
    bars = [fig.add_subplot(gs[0, i]) for i in range(3)]
    line = fig.add_subplot(gs[1, :])
    k = len(points)
    width = 0.8 / max(k, 1)
    for j, (label, per, color) in enumerate(points):
        x = per["replica"].to_numpy() + (j - (k - 1) / 2) * width
        share = per["routed"] / max(per["routed"].sum(), 1)
        for ax, values in zip(bars, (share, per["busy_fraction"], per["prefix_hit_rate"])):
            ax.bar(x, values, width, color=color, label=label if ax is bars[0] else None)
    for ax, title in zip(bars, ("share of requests routed", "busy fraction", "prefix hit rate")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("replica")
        ax.grid(alpha=0.3, axis="y")
        if points:
            ax.set_xticks(points[0][1]["replica"])
    if points:
        even = 1 / len(points[0][1])
        bars[0].axhline(even, **SLO)
    if not busiest_steps.empty:
        # Requests in the system per replica over time, on a common 200-bin grid.
        end = float((busiest_steps["start_s"] + busiest_steps["duration_s"]).max())
        grid = np.linspace(0.0, end, 200)
        for i, g in busiest_steps.groupby("replica"):
            idx = np.searchsorted(g["start_s"].to_numpy(), grid, side="right") - 1
            vals = np.where(idx >= 0, g["num_in_system"].to_numpy()[np.clip(idx, 0, None)], 0)
            line.plot(grid, vals, lw=1.0, label=f"replica {i}")
        line.legend(fontsize=7, ncol=8, loc="upper right")
    line.set_xlabel("simulated time (s)")
    line.set_ylabel("requests in system")
    line.set_title(f"load per replica over time ({busiest_label})", fontsize=10)
    line.grid(alpha=0.3)
    if caption:
        fig.suptitle(caption, fontsize=10)
    fig.tight_layout(rect=(0, 0.05 + 0.04 * ((k - 1) // 3), 1, 1))
    _legend_below(fig, bars[0])
    fig.savefig(path, dpi=110)
    plt.close(fig)
