"""`simulate search` outputs: a per-configuration table, every run, a figure, summary.md and
pick.json (the pick and its ties, each with the commands that deploy and check it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from twinserve.sim.config import StudyConfig  # noqa: E402
from twinserve.sim.report import markdown_table, write_table  # noqa: E402
from twinserve.sim.search import RateSearch  # noqa: E402
from twinserve.sim.search_commands import commands, workload_lengths  # noqa: E402

SEARCH_COLUMNS = ("model", "hardware", "tp", "max_rate", "bracket_hi", "band_lo", "band_hi",
                  "seed_rates", "runs", "status", "gpus", "tokens_per_s_per_gpu",
                  "output_tokens_per_s_per_gpu",
                  "tokens_per_s", "usd_per_hour", "usd_per_mtok", "usd_per_mtok_output",
                  "replicas_for_target", "usd_per_hour_for_target", "num_requests", "convergence")


def _label(row: dict[str, Any], axes: Sequence[str]) -> str:
    return "\n".join(f"{a}={row[a]}" for a in axes) if axes else row["hardware"]


def plot_search(rows: Sequence[dict[str, Any]], axes: Sequence[str], path: Path) -> None:
    """Max rate under the SLOs and cost per million tokens, one bar per configuration."""
    labels = [_label(r, axes) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = range(len(rows))
    ax1.bar(x, [r["max_rate"] for r in rows], color="C0")
    ax1.set_ylabel("max request rate under SLOs (req/s)")
    ax1.set_title("capacity per configuration")
    costs = [r["usd_per_mtok"] if math.isfinite(r["usd_per_mtok"]) else 0.0 for r in rows]
    ax2.bar(x, costs, color="C2")
    ax2.set_ylabel("USD per million tokens (prompt + output)")
    ax2.set_title("cost at that rate")
    for ax in (ax1, ax2):
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _what(row: dict[str, Any], axes: Sequence[str]) -> str:
    return ", ".join(f"{a}={row[a]}" for a in axes) or row["hardware"]


def pick_record(s: RateSearch, row: dict[str, Any], base: StudyConfig,
                axes: Sequence[str]) -> dict[str, Any]:
    """One pick or tie for pick.json: what it is, its band, its cost and its commands."""
    isl, osl = workload_lengths(s.cfg)
    rate = row.get("band_lo") or row["max_rate"]
    if s.integer:  # a client count: the band's low end, whole
        rate = max(1, int(rate))
    n = int(row.get("num_requests") or s.cfg.workload.num_requests)
    rec = {"configuration": {a: row[a] for a in axes}, "model": row["model"],
           "hardware": row["hardware"], "tp": row["tp"], "gpus": row["gpus"],
           "max_rate": row["max_rate"], "band": [row.get("band_lo"), row.get("band_hi")],
           "seed_rates": row.get("seed_rates", ""), "usd_per_hour": row["usd_per_hour"],
           "usd_per_mtok": row["usd_per_mtok"], "mean_input_tokens": isl,
           "mean_output_tokens": osl, "check_rate_per_replica": rate,
           "commands": commands(s.cfg, row, isl, osl, rate, n)}
    c = s.cfg.cluster
    if c.num_prefill_replicas:
        rec["disaggregated"] = (f"{c.num_prefill_replicas} prefill + "
                                f"{c.num_replicas - c.num_prefill_replicas} decode instances of "
                                "this `vllm serve` shape, joined by a KV connector "
                                "(vLLM's --kv-transfer-config)")
    if base.search.target_rate > 0:
        rec["replicas_for_target"] = row["replicas_for_target"]
        rec["usd_per_hour_for_target"] = row["usd_per_hour_for_target"]
    return rec


def _why_not(row: dict[str, Any]) -> str:
    if row.get("no_fit"):
        return row["no_fit"]
    if row.get("error"):
        return row["error"]
    if row["status"] == "no rate meets the SLOs":
        return f"no rate down to min_rate meets the SLOs (lowest tried {row['bracket_hi']:.3g} req/s)"
    return row["status"]


def write_search(out_dir: Path, searches: Sequence[RateSearch], rows: Sequence[dict[str, Any]],
                 axes: Sequence[str], best: dict[str, Any] | None,
                 tied: Sequence[dict[str, Any]], picks: Sequence[dict[str, Any]], title: str,
                 notes: Sequence[str] = ()) -> dict[str, Path]:
    """Write search.csv, search_runs.csv, figures/search.png, summary.md and pick.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if best is not None:  # the pick first, then its ties in table order
        picks = sorted(picks, key=lambda p: p["configuration"] != {a: best[a] for a in axes})
    table = pd.DataFrame(list(rows))
    written["search"] = write_table(table, out_dir / "search", "csv")
    runs = [{**row, **s.point, "rate": rate}
            for s in searches for rate, row in sorted(s.runs.items())]
    written["runs"] = write_table(pd.DataFrame(runs), out_dir / "search_runs", "csv")
    figs = out_dir / "figures"
    figs.mkdir(exist_ok=True)
    written["figure"] = figs / "search.png"
    plot_search(rows, axes, written["figure"])
    unit = "clients" if searches and searches[0].integer else "req/s"
    md = [f"# {title}", ""] + [f"- {n}" for n in notes]
    if best is not None:
        what = ", ".join(f"{a}={best[a]}" for a in axes) or best["hardware"]
        md.append(f"- cheapest: {what} ({best['gpus']} GPU(s), max {best['max_rate']:.3g} {unit}, "
                  f"{best['usd_per_mtok']:.3g} USD per million tokens"
                  + (f", {best['replicas_for_target']} replica(s) = "
                     f"{best['usd_per_hour_for_target']:.3g} USD/hour for the target rate)"
                     if "replicas_for_target" in best else ")"))
        if best.get("band_lo"):
            md.append(f"- its band: {best['band_lo']:.3g}-{best['band_hi']:.3g} {unit} "
                      f"(seeds {best.get('seed_rates') or '-'})")
        if best.get("convergence"):
            md.append(f"- its convergence: {best['convergence']}")
        md.append("- ties (not told apart from the pick within their bands): "
                  + ("; ".join(f"{_what(t, axes)} ({t['max_rate']:.3g} {unit}, band "
                               f"{t['band_lo']:.3g}-{t['band_hi']:.3g})" for t in tied)
                     or "none"))
    else:
        md.append("- NOTHING FITS: no configuration meets the SLOs; why, for each:")
        md += [f"  - {_what(r, axes)}: {_why_not(r)}" for r in rows]
    for r in rows if best is not None else ():
        if r.get("no_fit"):
            what = ", ".join(f"{a}={r[a]}" for a in axes) or r["hardware"]
            md.append(f"- does not fit: {what}: {r['no_fit']}")
    failed = [r for r in rows if r["error"]]
    for r in failed if best is not None else ():
        md.append(f"- FAILED: {r['error']}")
    md += ["", markdown_table(table, list(dict.fromkeys([*axes, *SEARCH_COLUMNS]))), "",
           f"![search]({written['figure'].relative_to(out_dir)})", "",
           "Tables: `search.csv` (one row per configuration), `search_runs.csv` (every "
           "simulated rate with its metrics and whether it met the SLOs)."]
    if picks:
        md += ["", "## Deploy and check", ""]
        for p in picks:
            md += [f"{_what(p['configuration'] | {'hardware': p['hardware']}, axes)}"
                   + (f" x {p['replicas_for_target']} replica(s)" if "replicas_for_target" in p
                      else "") + (f" ({p['disaggregated']})" if "disaggregated" in p else "")
                   + ":", "", "```",
                   p["commands"]["vllm_serve"], p["commands"]["twinserve_serve"],
                   p["commands"]["vllm_bench_serve"], "```", ""]
    pick = {"pick": picks[0] if best is not None and picks else None, "ties": list(picks[1:]),
            "notes": list(notes)}
    written["pick"] = out_dir / "pick.json"
    written["pick"].write_text(json.dumps(pick, indent=2, default=str))
    written["markdown"] = out_dir / "summary.md"
    written["markdown"].write_text("\n".join(md) + "\n")
    return written
