"""The `simulate search` subcommand: parse, search, band, write outputs, print the summary.

Exit status: 0 with a pick, 2 for bad input, 3 when no configuration meets the SLOs, 1 when
runs failed and nothing was answered.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from twinserve.core.errors import TwinserveError

from twinserve.sim.config import StudyConfig, set_field
from twinserve.sim.convergence import convergence_rows
from twinserve.sim.search import cheapest, summary_rows
from twinserve.sim.search_band import add_bands, banded_search, ties
from twinserve.sim.search_checks import check_search, search_slos
from twinserve.sim import search_driver
from twinserve.sim.search_driver import search_pool
from twinserve.sim.search_screen import screen_notes
from twinserve.sim.study import parse_grid

NOTHING_FITS = 3


def run_search(args: argparse.Namespace, base: Callable[[argparse.Namespace], StudyConfig]) -> int:
    """Entry of `simulate search`; returns the exit status."""
    try:
        cfg = base(args)
        if args.tolerance is not None:
            set_field(cfg, "search.tolerance", args.tolerance, "--tolerance")
        if args.target_rate is not None:
            set_field(cfg, "search.target_rate", args.target_rate, "--target-rate")
        if args.requests is not None:
            # --requests is the run length the search starts from (rechecks double it).
            set_field(cfg, "search.requests_per_run", args.requests, "--requests")
        slos = search_slos(cfg, args.slo)
        grid = {**cfg.search.grid, **parse_grid(args.grid)}  # --grid axes win over the file's
        check_search(cfg, grid, explicit_target=args.target_rate is not None)
        t0 = time.perf_counter()
        # One pool for every stage: its workers are forked once (sim.search_driver.search_pool).
        with search_pool(args.workers, args.ray):
            loading = _load_report()
            searches = banded_search(cfg, grid, slos, args.workers, args.ray)
        wall = time.perf_counter() - t0
        if all(s.error for s in searches):  # nothing to rank: a bad input, not a result
            for s in searches:
                print(f"simulate: error: {s.error}", file=sys.stderr)
            return 2
        target = cfg.search.target_rate
        rows = summary_rows(searches, target)
        convergence_rows(searches, rows, cfg.search.convergence)
        band_notes = add_bands(rows, searches, cfg, target)
        best = cheapest(rows, target)
        tied = ties(rows, best, target)
        axes = [k.split(".", 1)[1] for k in grid]
        if any(s.point.get("mode", "agg") != "agg" for s in searches):
            axes.append("mode")  # agg and disagg rows side by side
        seed_res = max((s.seed_resolution for s in searches), default=0.0)
        notes = _notes(cfg, slos, rows, wall, len(searches), band_notes, seed_res)
        notes += screen_notes(searches, best, cfg.search.screen_margin)
        out = Path(args.out or "simulate-search")
        if loading is not None:
            loading.join()
        from twinserve.sim.search_report import pick_record, write_search

        picks = [pick_record(s, r, cfg, axes) for s, r in zip(searches, rows)
                 if r is best or any(r is t for t in tied)]
        written = write_search(out, searches, rows, axes, best, tied, picks,
                               f"simulate search: {cfg.run.name}", notes)
    except (TwinserveError, OSError) as e:
        print(f"simulate: error: {e}", file=sys.stderr)
        return 2
    print((out / "summary.md").read_text())
    print(f"wrote {', '.join(str(p) for p in written.values())}")
    failed = [s for s in searches if s.error]
    for s in failed:
        print(f"simulate: error: {s.error}", file=sys.stderr)
    if best is not None:
        return 0
    # Nothing meets the SLOs: summary.md says why for each configuration.
    return 1 if failed else NOTHING_FITS


def _load_report() -> threading.Thread | None:
    """Load sim.search_report (matplotlib and pandas' plotting: ~0.3 CPU s) in a thread while the
    shared pool's workers run the search, where it cost that much wall time before the first run;
    None (loaded where it is used) without a pool of workers to hide it behind (one worker, Ray).
    An import that fails here fails again, with its error, where run_search imports it."""
    if search_driver._SHARED is None:
        return None

    def load() -> None:
        try:
            importlib.import_module("twinserve.sim.search_report")
        except Exception:  # noqa: BLE001 - raised again by run_search's own import
            pass

    thread = threading.Thread(target=load, name="search-report-import", daemon=True)
    thread.start()
    return thread


def _notes(cfg: StudyConfig, slos: dict[str, float], rows: list[dict[str, Any]], wall: float,
           n: int, band_notes: list[str], seed_res: float = 0.0) -> list[str]:
    sc = cfg.search
    slo_text = ", ".join(f"{k.replace('_s', '')} <= {v:g} s" for k, v in slos.items())
    lengths = sorted({int(r["num_requests"]) for r in rows if r["max_rate"] > 0})
    start = sc.requests_per_run or cfg.workload.num_requests
    notes = [f"SLOs: {slo_text}; every request must complete",
             f"{n} configuration(s) searched in {wall:.1f} s wall: "
             f"{sum(r['runs_total'] for r in rows)} runs, "
             f"{sum(r['requests_simulated'] for r in rows):,} requests simulated; bracket "
             f"tolerance {sc.tolerance:.0%}",
             f"run length: runs start at {start} requests and each answer is rechecked at twice "
             f"its length until its max rate moves by less than {sc.convergence:.0%} (at most "
             f"{sc.max_requests_per_run}); the answers below come from runs of "
             + (", ".join(str(x) for x in lengths) or "-") + " requests (`num_requests` column)",
             f"band: {sc.band_seeds} more seed(s) searched at {start} requests"
             + (f", each to a bracket of up to {seed_res:.0%} (two of its answer's grid steps; "
                "the bracket's width is added to their spread)" if seed_res else "")
             + "; their spread (a 95% prediction interval for another seed, relative to their "
             "mean) is applied to each answer (`seed_rates`: seed:rate at that length)"
             if sc.band_seeds else
             "band: none (band_seeds = 0): each answer is one seed's",
             *band_notes,
             "replicas and USD/hour for the target come from the LOW end of each band; "
             "configurations whose best cost in their band is within the pick's worst are ties",
             "prices (USD per GPU-hour): " + ", ".join(
                 sorted({f"{r['hardware']} {r['usd_per_hour'] / r['gpus']:g}" for r in rows}))]
    if sc.axis == "concurrency":
        notes.insert(0, "searched: the most closed-loop clients ([workload] concurrency) meeting "
                     "the SLOs; `max_rate`, `bracket_hi` and the band count clients, "
                     "`request_rate` is the req/s they completed")
    if sc.target_rate:
        notes.append(f"target rate: {sc.target_rate:g} req/s")
    return notes
