"""Two `simulate validate` outputs side by side on the rows both simulated (docs/validate-accuracy.md).

    python experiments/validate_compare.py --before DIR --after DIR [--by backend] [--by model,backend]

Prints, per split and per group, the rows and TPOT and TTFT as "median |error| (median signed
error, share within 20%)", before and after. `--add-latency vllm=0.06,...` adds a front-end latency
(seconds) to one side's TTFT after the fact, as sim/validate_engines.py does in the run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def _stats(err: pd.Series) -> str:
    e = err.dropna()
    if e.empty:
        return "-"
    return f"{e.abs().median():.1%} ({e.median():+.0%}, {(e.abs() <= 0.2).mean():.0%})"


def load(folder: str, latency: dict[str, float] | None = None) -> pd.DataFrame:
    """validation.csv of a run, with TTFT errors recomputed when a latency is added."""
    df = pd.read_csv(Path(folder) / "validation.csv")
    if latency:
        add = df["backend"].map(latency).fillna(0.0) * 1000.0
        df["pred_ttft_ms"] = df["pred_ttft_ms"] + add
        df["err_ttft"] = df["pred_ttft_ms"] / df["meas_ttft_ms"] - 1.0
    return df


def table(before: pd.DataFrame, after: pd.DataFrame, by: list[str]) -> str:
    """Markdown rows: group, n, TPOT before -> after, TTFT before -> after (rows both simulated)."""
    m = before.merge(after[["row_id", "err_tpot", "err_ttft"]], on="row_id", suffixes=("_b", "_a"))
    m = m[m["err_tpot_b"].notna() & m["err_tpot_a"].notna()]
    lines = ["| split | " + "".join(f"{c} | " for c in by) + "rows | TPOT before | TPOT after | TTFT before "
             "| TTFT after |", "|" + "---|" * (len(by) + 6)]
    for split, part in [("dev", m[m["split"] == "dev"]), ("heldout", m[m["split"] == "heldout"]), ("all", m)]:
        if part.empty or (split == "all" and part["split"].nunique() < 2):
            continue
        items = [(("all",) * len(by), part)] + (list(part.groupby(by)) if by else [])
        for key, g in items:
            key = key if isinstance(key, tuple) else (key,)
            lines.append(f"| {split} | " + "".join(f"{k} | " for k in key) + f"{len(g)} | {_stats(g['err_tpot_b'])} | "
                         f"{_stats(g['err_tpot_a'])} | {_stats(g['err_ttft_b'])} | {_stats(g['err_ttft_a'])} |")
    return "\n".join(lines)


def main() -> None:
    """Parse the flags and print one table per --by."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a validate --out folder")
    ap.add_argument("--after", required=True, help="another one")
    ap.add_argument("--by", action="append", default=None, help="group columns, comma-separated")
    ap.add_argument("--add-latency", default="", help="engine=seconds,... added to --before's TTFT")
    args = ap.parse_args()
    lat = {k: float(v) for k, v in (p.split("=") for p in args.add_latency.split(",") if p)}
    before, after = load(args.before, lat), load(args.after)
    for by in args.by or ["", "backend"]:
        print(table(before, after, [c for c in by.split(",") if c]))
        print()


if __name__ == "__main__":
    main()
