"""Two `simulate search` outputs side by side: pick, ties and each configuration's answer and band.

    python experiments/search_compare.py OLD_OUT NEW_OUT

Prints one row per configuration (max rate [band] and runs, old -> new), whether the new answer
lies inside the old band and the old inside the new, then the picks and ties of each, and the
work (runs, requests simulated) of each.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

SKIP = {"model", "hardware", "tp", "max_rate", "bracket_hi", "runs", "runs_total",
        "requests_simulated", "status", "error", "no_fit", "gpus", "usd_per_hour"}


def _load(out: Path) -> tuple[pd.DataFrame, dict]:
    df = pd.read_csv(out / "search.csv")
    pick = json.loads((out / "pick.json").read_text()) if (out / "pick.json").exists() else {}
    return df, pick


def _axes(df: pd.DataFrame) -> list[str]:
    cols = list(df.columns)
    return cols[:cols.index("model")]


def _name(rec: dict, axes: list[str]) -> str:
    return ", ".join(f"{rec[a]}" for a in axes if a in rec)


def _band(r: pd.Series) -> str:
    if not r["max_rate"]:
        return "-"
    band = f" [{r['band_lo']:.3g}-{r['band_hi']:.3g}]" if r.get("seed_rates") == r.get("seed_rates") \
        and str(r.get("seed_rates") or "") else " (no seed band)"
    return f"{r['max_rate']:.4g}{band}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="the first `simulate search` output folder")
    ap.add_argument("new", type=Path, help="the second one")
    args = ap.parse_args()
    old, old_pick = _load(args.old)
    new, new_pick = _load(args.new)
    axes = _axes(old)
    key = lambda df: df[[a for a in axes if a != "mode" or df[a].nunique() > 1]].astype(str).agg(  # noqa: E731
        ", ".join, axis=1)
    old.index, new.index = key(old), key(new)
    print("| configuration | old max rate [band] | new max rate [band] | change | new in old band "
          "| old in new band | runs old -> new |")
    print("|---|---|---|---|---|---|---|")
    for name in old.index:
        o, n = old.loc[name], new.loc[name]
        change = f"{n['max_rate'] / o['max_rate'] - 1:+.1%}" if o["max_rate"] else "-"
        inside = lambda a, b: ("yes" if b["band_lo"] <= a["max_rate"] <= b["band_hi"]  # noqa: E731
                               else "NO") if str(b.get("seed_rates") or "") not in ("", "nan") else "-"
        print(f"| {name} | {_band(o)} | {_band(n)} | {change} | {inside(n, o)} | {inside(o, n)} "
              f"| {o['runs_total']} -> {n['runs_total']} |")
    for label, p in (("old", old_pick), ("new", new_pick)):
        if p.get("pick"):
            ties = sorted(_name(t["configuration"], axes) for t in p["ties"])
            print(f"\n{label} pick: {_name(p['pick']['configuration'], axes)}; ties ({len(ties)}): "
                  + "; ".join(ties))
    for label, df in (("old", old), ("new", new)):
        print(f"{label}: {int(df['runs_total'].sum())} runs, {int(df['requests_simulated'].sum()):,} "
              "requests simulated")


if __name__ == "__main__":
    main()
