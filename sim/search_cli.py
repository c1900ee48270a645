"""The `simulate search` subcommand: parse, search, write outputs, print the summary."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

from twinserve.core.errors import TwinserveError

from twinserve.sim.config import StudyConfig, set_field
from twinserve.sim.convergence import converged_search, convergence_rows
from twinserve.sim.search import cheapest, parse_slos, summary_rows
from twinserve.sim.search_report import write_search
from twinserve.sim.study import parse_grid


def run_search(args: argparse.Namespace, base: Callable[[argparse.Namespace], StudyConfig]) -> int:
    """Entry of `simulate search`; returns the exit status."""
    try:
        cfg = base(args)
        if args.tolerance is not None:
            set_field(cfg, "search.tolerance", args.tolerance, "--tolerance")
        if args.target_rate is not None:
            set_field(cfg, "search.target_rate", args.target_rate, "--target-rate")
        slos = parse_slos(args.slo) if args.slo else {"p99_ttft_s": cfg.slo.ttft_s,
                                                       "p99_tpot_s": cfg.slo.tpot_s}
        grid = {**cfg.search.grid, **parse_grid(args.grid)}  # --grid axes win over the file's
        t0 = time.perf_counter()
        searches = converged_search(cfg, grid, slos, workers=args.workers, ray_address=args.ray)
        wall = time.perf_counter() - t0
        if all(s.error for s in searches):  # nothing to rank: a bad input, not a result
            for s in searches:
                print(f"simulate: error: {s.error}", file=sys.stderr)
            return 2
        target = cfg.search.target_rate
        sc = cfg.search
        rows = summary_rows(searches, target)
        convergence_rows(searches, rows, cfg.search.convergence)
        best = cheapest(rows, target)
        axes = [k.split(".", 1)[1] for k in grid]
        slo_text = ", ".join(f"{k.replace('_s', '')} <= {v:g} s" for k, v in slos.items())
        notes = [f"SLOs: {slo_text}; every request must complete",
                 f"{len(searches)} configuration(s) searched in {wall:.1f} s wall; bracket "
                 f"tolerance {cfg.search.tolerance:.0%}",
                 f"run length: {sc.requests_per_run or cfg.workload.num_requests} requests, each "
                 f"answer rechecked at twice the length until its max rate moves by less than "
                 f"{sc.convergence:.0%} (at most {sc.max_requests_per_run} requests; `convergence` column)",
                 "prices (USD per GPU-hour): " + ", ".join(
                     sorted({f"{r['hardware']} {r['usd_per_hour'] / r['gpus']:g}" for r in rows}))]
        if target:
            notes.append(f"target rate: {target:g} req/s")
        out = Path(args.out or "simulate-search")
        written = write_search(out, searches, rows, axes, best,
                               f"simulate search: {cfg.run.name}", notes)
    except (TwinserveError, OSError) as e:
        print(f"simulate: error: {e}", file=sys.stderr)
        return 2
    print((out / "summary.md").read_text())
    print(f"wrote {', '.join(str(p) for p in written.values())}")
    failed = [s for s in searches if s.error]
    for s in failed:
        print(f"simulate: error: {s.error}", file=sys.stderr)
    # An answer is an answer: configurations the model does not fit are listed, not failures.
    return 0 if best is not None or not failed else 1
