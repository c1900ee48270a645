"""`simulate validate --silicon`: filters, the runs (processes or Ray), validation.csv and summary.json."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from twinserve.core.errors import TwinserveError

from twinserve.sim.runner import LOCAL_RAY, PointFailure, run_jobs
from twinserve.sim.validate import (expressible, finish_record, row_record, simulate_row, summarize_validation,
                                    summary_table)
from twinserve.sim.validate_protocol import DEFAULT_WINDOW, WINDOWS
from twinserve.sim.validate_rows import SiliconDataError, load_rows


def add_parser(sub: Any) -> None:
    """The `validate` subcommand's flags."""
    p = sub.add_parser("validate", help="simulate aiconfigurator-core's measured rows and report the errors")
    p.add_argument("--silicon", action="store_true", required=True,
                   help="judge against aiconfigurator-core's silicon_sample.csv (the only source so far)")
    p.add_argument("--backend", help="vllm, sglang or trtllm")
    p.add_argument("--system", help="e.g. h200_sxm, b200_sxm, gb200")
    p.add_argument("--model", help="e.g. Llama-3.1-70B or meta-llama/Llama-3.1-70B")
    p.add_argument("--cost-model", default="roofline", help="roofline (default) or aic")
    p.add_argument("--rows", choices=("dev", "heldout", "all"), default="all",
                   help="development rows (Llama-3.1-70B, Qwen3-32B, gpt-oss-120b, DeepSeek-R1), the rest, or all")
    p.add_argument("--window", choices=WINDOWS, default=DEFAULT_WINDOW,
                   help="benchmark: as the row's benchmark ran and counted (10 N requests, all counted, lengths "
                        "on [0.8 L, L]); steady: cold wave left out, one wave measured, fixed lengths")
    p.add_argument("--max-clients", type=int, default=None,
                   help="only rows of at most N clients (the benchmark window sends 10 N requests a row)")
    p.add_argument("--limit", type=int, default=None,
                   help="at most N rows, spread evenly over the filtered rows (a stratified subset)")
    p.add_argument("--out", default=argparse.SUPPRESS, help="output folder")
    p.add_argument("--workers", type=int, default=argparse.SUPPRESS,
                   help="processes that simulate rows in parallel")
    p.add_argument("--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                   help="run rows as Ray tasks: on the cluster at ADDRESS, or a local Ray")


class FilterError(SiliconDataError):
    """A --backend/--system/--model/--limit/--cost-model value that matches nothing; names what exists."""


def select_rows(df: pd.DataFrame, backend: str | None = None, system: str | None = None,
                model: str | None = None, rows: str = "all", limit: int | None = None) -> pd.DataFrame:
    """The rows the filters keep; FilterError naming the known values when one matches nothing."""
    for col, value in (("backend", backend), ("system", system)):
        if value is not None:
            known = sorted(df[col].dropna().unique())
            if value.lower() not in [k.lower() for k in known]:
                raise FilterError(f"--{col} {value!r}: no such {col} in the rows; known: {', '.join(known)}")
            df = df[df[col].str.lower() == value.lower()]
    if model is not None:
        m = model.lower()
        hit = (df["model"].str.lower() == m) | (df["model_path"].str.lower() == m)
        if not hit.any():
            known = sorted(df["model"].unique())
            raise FilterError(f"--model {model!r}: no rows for it here; known: {', '.join(known)}")
        df = df[hit]
    if rows != "all":
        df = df[df["split"] == rows]
    if limit is not None:
        if limit < 1:
            raise FilterError(f"--limit {limit}: must be >= 1")
        if limit < len(df):
            df = df.iloc[np.unique(np.linspace(0, len(df) - 1, limit).round().astype(int))]
    if df.empty:
        raise FilterError("the filters leave no rows")
    return df


def within_clients(df: pd.DataFrame, max_clients: int | None) -> pd.DataFrame:
    """The rows of at most max_clients clients (all when None); FilterError when none is left."""
    if max_clients is None:
        return df
    if max_clients < 1:
        raise FilterError(f"--max-clients {max_clients}: must be >= 1")
    kept = df[~(df["concurrency"] > max_clients)]  # rows without a concurrency stay: their reason is reported
    if kept.empty:
        raise FilterError(f"--max-clients {max_clients}: no row has so few clients "
                          f"(least: {int(df['concurrency'].min())})")
    return kept


def _check_cost_model(name: str) -> None:
    from twinserve.core.knobs import knob_of
    from twinserve.sim.config import EngineConfig
    allowed = knob_of(EngineConfig.__dataclass_fields__["cost_model"]).choice_list()
    if name not in ("roofline", "aic") or name not in allowed:
        have = ", ".join(c for c in allowed if c != "fitted")
        raise FilterError(f"--cost-model {name!r}: this build has {have}"
                          + (" (the measured backend, 'aic', is not merged yet)" if name == "aic" else ""))


def run_validation(df: pd.DataFrame, cost_model: str, workers: int | None, ray: str | None,
                   progress: bool = True, window: str = DEFAULT_WINDOW) -> pd.DataFrame:
    """Every row of df: its reason, or its prediction and errors; one record per row, in order."""
    records: list[dict[str, Any]] = []
    jobs: list[tuple[dict[str, Any], str]] = []
    where: list[int] = []
    for _, row in df.iterrows():
        rec = row_record(row)
        reason = expressible(row, cost_model)
        rec["expressible"] = not reason
        rec["reason"] = reason
        records.append(rec)
        if not reason:
            where.append(len(records) - 1)
            jobs.append((row.to_dict(), cost_model, {"window": window}))
    out = run_jobs(simulate_row, jobs, [{"row": j[0]["id"]} for j in jobs], workers, ray, "validate", progress)
    for i, res in zip(where, out):
        if isinstance(res, PointFailure):
            records[i] = finish_record(records[i], None, res.error)
        else:
            records[i] = finish_record(records[i], res)
    for i, rec in enumerate(records):
        if "err_tpot" not in rec:
            records[i] = finish_record(rec, None)
    return pd.DataFrame(records)


def run_validate(args: argparse.Namespace) -> int:
    """The `simulate validate` command: exit 0, or 2 with the reason on bad input."""
    t0 = time.perf_counter()
    try:
        _check_cost_model(args.cost_model)
        df = select_rows(load_rows(), args.backend, args.system, args.model, args.rows, args.limit)
        df = within_clients(df, getattr(args, "max_clients", None))
        window = getattr(args, "window", DEFAULT_WINDOW)
        frame = run_validation(df, args.cost_model, getattr(args, "workers", None), args.ray, window=window)
        summary = summarize_validation(frame)
        wall = time.perf_counter() - t0
        summary["run"] = {"cost_model": args.cost_model, "rows": int(len(frame)), "wall_s": round(wall, 1),
                          "loop": sorted(frame["loop"].dropna().unique()) if "loop" in frame else [],
                          "window": window,
                          "filters": {k: getattr(args, k) for k in ("backend", "system", "model", "rows", "limit")}}
        out = Path(getattr(args, "out", None) or "simulate-validate")
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / "validation.csv", index=False)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    except (TwinserveError, OSError) as e:
        print(f"simulate: error: {e}", file=sys.stderr)
        return 2
    print(summary_table(summary))
    failed = frame["sim_error"].astype(bool).sum()
    print(f"{len(frame)} rows, {int(frame['expressible'].sum())} expressible, {failed} failed in the simulator; "
          f"{wall:.1f} s wall; wrote {out / 'validation.csv'}, {out / 'summary.json'}")
    return 0
