"""Run length for `simulate search`: every answer is checked at twice its run length.

A p99 over a few hundred requests is a handful of requests, so a short run's max rate can be
far off; the length doubles until the rate moves less than `search.convergence`.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from twinserve.sim.config import StudyConfig, set_field
from twinserve.sim.search import RateSearch, run_searches, search_rates
from twinserve.sim.search_screen import out_of_reach, screen

def with_requests(cfg: StudyConfig, n: int) -> StudyConfig:
    """A copy of cfg whose runs are n requests long."""
    c = copy.deepcopy(cfg)
    set_field(c, "workload.num_requests", n)
    return c


def converged_search(base: StudyConfig, grid: dict[str, list[str]], slos: dict[str, float],
                     workers: int | None = None, ray_address: str | None = None,
                     progress: bool = True,
                     alongside: Callable[[list[RateSearch]], list[RateSearch]] | None = None
                     ) -> list[RateSearch]:
    """search_rates at search.requests_per_run, then each answer rechecked at doubled lengths.

    alongside(searches), called once the first length is screened when there is a recheck,
    gives more searches to drive with the first recheck round, in the same pool queue (the
    extra seeds, sim.search_band.banded_search): no barrier between the two stages."""
    sc = base.search
    n = sc.requests_per_run or base.workload.num_requests
    first = with_requests(base, n)
    w = first.workload
    if w.trace and not w.trace_cycle:
        # The search picks the length: a shorter trace runs whole and the note says so.
        set_field(first, "workload.allow_short_trace", True)
    # Answers rechecked at longer runs bisect to tolerance there: the first length needs less.
    rechecks = n * 2 <= sc.max_requests_per_run
    first_tol = max(sc.tolerance, sc.first_tolerance) if rechecks else sc.tolerance
    # Only answers rechecked and banded need the first length's tolerance: one already out of
    # the pick's reach even at its bracket's top stops there (sim.search_screen).
    reach = out_of_reach(sc.target_rate, sc.screen_margin) if rechecks else None
    searches = search_rates(first, grid, slos, workers, ray_address, progress, first_tol, reach)
    answered = ("ok", "max_rate cap")
    for s in searches:
        if s.status in answered:
            s.lengths.append((served(s, n), s.lo))
            s.first_hi = s.hi
    screen(searches, sc.target_rate, sc.screen_margin)
    todo = [s for s in searches if s.status in answered and s.lengths[-1][0] >= n
            and not s.screened]
    extra = (alongside(searches) if alongside is not None and todo
             and n * 2 <= sc.max_requests_per_run else [])
    while todo and n * 2 <= sc.max_requests_per_run:
        n *= 2
        again = []
        for s in todo:
            # Near the answer: start at it times how far the answers rechecked so far moved
            # (sim.search_driver), a step of the tolerance (two runs when it lands there); a
            # capped rate may be far above the longer runs' answer: halve down from it.
            ok = s.status == "ok"
            again.append(RateSearch(s.point, with_requests(s.cfg, n), start=0.0 if ok else s.lo,
                                    step=2.0, estimate=s.lo if ok else 0.0,
                                    near_step=1.0 + max(sc.tolerance, 0.005) if ok else 0.0,
                                    integer=s.integer))
        desc = f"recheck at {n}" + (" + seeds" if extra else "")
        run_searches(again + extra, slos, workers, ray_address, progress, desc=desc)
        extra = []
        for s, r in zip(todo, again):
            s.cfg, s.lo, s.hi, s.runs, s.error = r.cfg, r.lo, r.hi, r.runs, r.error
            s.runs_total += r.runs_total
            s.simulated += r.simulated
            s.lengths.append((served(s, n), r.lo))
        # A workload that ran out (a trace without trace_cycle) cannot be made longer.
        todo = [s for s in todo if s.status in answered and relative_change(s) >= sc.convergence
                and s.lengths[-1][0] > s.lengths[-2][0]]
    return searches


def served(s: RateSearch, asked: int) -> int:
    """Requests the answer's run really had (fewer than asked when a trace ran out)."""
    row = s.runs.get(s.lo) or {}
    return int(row.get("num_requests") or asked)


def relative_change(s: RateSearch) -> float:
    """|last - previous| / previous of the max rates at the last two lengths (inf if unknown)."""
    if len(s.lengths) < 2 or s.lengths[-2][1] <= 0:
        return float("inf")
    prev, last = s.lengths[-2][1], s.lengths[-1][1]
    return abs(last - prev) / prev


def convergence_note(s: RateSearch, tolerance: float) -> str:
    """What the answer's own convergence check found, in a few words."""
    if s.screened:
        return (f"screened: not rechecked, no seed band ({s.lengths[0][0]} requests, bracket "
                f"{s.lo:.3g}-{s.hi:.3g}): dearer than the cheapest even with both rates moved "
                "by screen_margin")
    if s.dominated:
        return (f"dominated: misses the SLOs at {s.hi:.3g} ({s.cfg.workload.num_requests} "
                "requests), below which it is dearer than the cheapest even with both rates "
                "moved by screen_margin: no pass searched")
    if len(s.lengths) < 2:
        if not s.lengths:
            return ""
        return (f"not rechecked: {s.lengths[0][0]} requests, all the workload holds "
                "(trace_cycle = true replays a trace)")
    (n0, r0), (n1, r1) = s.lengths[-2], s.lengths[-1]
    verdict = "converged" if relative_change(s) < tolerance else "NOT converged"
    note = (f"{verdict}: {r0:.3g} -> {r1:.3g} req/s ({(r1 - r0) / r0:+.1%}) from {n0} to {n1} "
            "requests")
    if n1 <= n0:
        note += " (the workload ran out: set trace_cycle = true to replay a trace)"
    if s.unbanded:
        note += ("; no seed band: dearer than the cheapest even with both rates moved by "
                 "screen_margin")
    return note


def convergence_rows(searches: list[RateSearch], rows: list[dict[str, Any]],
                     tolerance: float) -> None:
    """Add each answer's convergence note and run length to its summary row."""
    for s, row in zip(searches, rows):
        row["convergence"] = convergence_note(s, tolerance)
        row["num_requests"] = s.lengths[-1][0] if s.lengths else s.cfg.workload.num_requests
