"""Which configurations could still be `simulate search`'s pick or a tie after the first runs.

Rechecks at longer runs and the seed band cost most of a search; a configuration that stays
dearer than the cheapest even with its rate `screen_margin` higher and the cheapest's that much
lower cannot become the pick or tie with it (sim.search_band.ties compares the same costs), so
its first answer stands, marked `screened`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from twinserve.sim.search import RateSearch, fleet, summary_rows


def cost_at(row: dict[str, Any], scale: float, target_rate: float) -> float:
    """A summary row's cost with its rate times scale: USD/hour for the target, else per M tokens."""
    if not row["max_rate"] > 0 or scale <= 0:
        return math.inf
    if target_rate > 0:
        rate = row["request_rate"] * scale
        return row["usd_per_hour"] * math.ceil(target_rate / rate) if rate > 0 else math.inf
    return row["usd_per_mtok"] / scale


def contenders(searches: Sequence[RateSearch], target_rate: float, margin: float) -> list[bool]:
    """Per search: could it be the pick or a tie once each rate may move by +-margin?"""
    if margin <= 0:
        return [True] * len(searches)
    rows = summary_rows(searches, target_rate)
    worst = min((cost_at(r, 1.0 - margin, target_rate) for r in rows), default=math.inf)
    # A capped answer may lie anywhere above the cap: never screened.
    return [s.status == "max_rate cap" or cost_at(r, 1.0 + margin, target_rate) <= worst
            for s, r in zip(searches, rows)]


def out_of_reach(target_rate: float, margin: float
                 ) -> Callable[[RateSearch, Sequence[RateSearch]], bool] | None:
    """For the first run length: True once a search would be screened even at the top of its
    bracket (hi, a rate it failed at), so bisecting it further cannot change that (None: off).

    The cheapest's answer only rises as searches go on, so a search out of reach now stays out
    of reach, and screen() marks it screened from its lower answer (lo < hi) too. A search with
    no pass yet is out of reach (dominated) once a rate it failed at is: its answer lies below
    that rate, where it is dearer than the cheapest even moved by margin; it needs no pass.
    The function's `floor(s, searches)` is the least rate at which a miss shows that (0: none
    yet): the driver runs a search with no pass there instead of lower (a pass there is a
    higher first pass; a miss ends it)."""
    if margin <= 0:
        return None
    rows: dict[tuple[int, float], dict[str, Any]] = {}
    memo: dict[int, tuple[RateSearch, float]] = {}  # tokens per request, by search

    def row(s: RateSearch) -> dict[str, Any]:
        key = (id(s), s.lo)
        if key not in rows:
            rows[key] = summary_rows([s], target_rate)[0]
        return rows[key]

    def worst(searches: Sequence[RateSearch]) -> float:
        return min((cost_at(row(o), 1.0 - margin, target_rate) for o in searches
                    if o.lo > 0 and not o.error), default=math.inf)

    def settled(s: RateSearch, searches: Sequence[RateSearch]) -> bool:
        if not math.isfinite(s.hi) or s.error or s.no_fit:
            return False
        if s.lo > 0:
            return cost_at(row(s), s.hi / s.lo * (1.0 + margin), target_rate) > worst(searches)
        return cost_below(s, s.hi * (1.0 + margin), searches, target_rate, memo) > worst(searches)

    def floor(s: RateSearch, searches: Sequence[RateSearch]) -> float:
        """The least rate r at which a miss settles s (its cost at r x (1 + margin) above the
        cheapest's worst), 0 when none is known or s has passed a rate."""
        w = worst(searches)
        if s.lo > 0 or s.error or s.no_fit or not math.isfinite(w):
            return 0.0
        sc = s.cfg.search
        lo, hi = sc.min_rate, sc.max_rate
        k = 0.0 if s.integer or target_rate > 0 else tokens_per_rate(s, searches, memo)

        def dearer(rate: float) -> bool:
            return cost_below(s, rate * (1.0 + margin), searches, target_rate, memo, k) > w

        if not dearer(lo):
            return 0.0
        if dearer(hi):
            return hi  # dominated at any rate: a miss at max_rate shows it (a pass is the cap)
        for _ in range(60):  # cost falls as the rate rises: bisect for where it reaches w
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if dearer(mid) else (lo, mid)
        return lo

    settled.floor = floor  # type: ignore[attr-defined]
    return settled


def _tokens(s: RateSearch, memo: dict[int, tuple[RateSearch, float]]) -> float:
    """Mean prompt + output tokens of a request of s's workload (memoized by search; the entry
    holds the search, so its id is not reused by another while the memo lives)."""
    hit = memo.get(id(s))
    if hit is None or hit[0] is not s:
        from twinserve.sim.search_commands import workload_lengths

        hit = memo[id(s)] = (s, float(sum(workload_lengths(s.cfg))))
    return hit[1]


def cost_below(s: RateSearch, rate: float, searches: Sequence[RateSearch],
               target_rate: float, memo: dict[int, tuple[RateSearch, float]] | None = None,
               k: float | None = None) -> float:
    """The least cost s could have with an answer below rate, before it has passed any: USD/hour
    for the target, else per M tokens at rate x k tokens/s per req/s (tokens_per_rate); 0
    (never out of reach) for a client count."""
    if s.integer or rate <= 0:
        return 0.0
    _, usd_h = fleet(s.cfg)
    if target_rate > 0:
        return usd_h * math.ceil(target_rate / rate)
    k = tokens_per_rate(s, searches, {} if memo is None else memo) if k is None else k
    return usd_h / (rate * k * 3600) * 1e6 if k > 0 else 0.0


def tokens_per_rate(s: RateSearch, searches: Sequence[RateSearch],
                    memo: dict[int, tuple[RateSearch, float]]) -> float:
    """The most tokens/s a run of s can show per req/s: its workload's tokens per request (a
    run's throughput is its tokens over its duration, which its drain only lengthens), scaled up
    by the most any passing run of these searches exceeded its own (a short arrival span)."""
    over = max((row["total_token_throughput"] / (r * _tokens(o, memo)) for o in searches
                if not o.integer for r, row in o.runs.items()
                if row.get("meets_slo") and r > 0 and row.get("total_token_throughput")),
               default=1.0)
    return _tokens(s, memo) * max(1.0, over)


def screen(searches: Sequence[RateSearch], target_rate: float, margin: float) -> None:
    """Mark the searches that cannot be the pick or a tie (RateSearch.screened)."""
    for s, keep in zip(searches, contenders(searches, target_rate, margin)):
        s.screened = s.status == "ok" and not keep
    reach = out_of_reach(target_rate, margin)
    for s in searches:
        # Stopped with no pass above min_rate: settled by out_of_reach (below the rate it missed
        # it is dearer than the cheapest, whose answer has only risen since).
        s.dominated = (reach is not None and s.lo == 0.0 and math.isfinite(s.hi)
                       and s.hi > s.cfg.search.min_rate and not s.error and not s.no_fit
                       and reach(s, searches))


def skip_bands(searches: Sequence[RateSearch], target_rate: float, margin: float) -> None:
    """After the rechecks: mark the answers that cannot be the pick or a tie even with both rates
    moved by margin (the same rule as screen, on the rechecked answers); they get no seed band."""
    for s, keep in zip(searches, contenders(searches, target_rate, margin)):
        s.unbanded = s.status == "ok" and not s.screened and not keep


def screen_notes(searches: Sequence[RateSearch], best: dict[str, Any] | None,
                 margin: float) -> list[str]:
    """The summary's lines on screening: how many, and a warning when the pick's band is wider
    than the margin (then a screened configuration might have tied)."""
    n = sum(s.screened for s in searches)
    unbanded = sum(s.unbanded for s in searches)
    dominated = sum(s.dominated for s in searches)
    if not n and not unbanded and not dominated:
        return []
    notes = []
    if dominated:
        notes.append(f"dominated: {dominated} configuration(s) stopped at a rate they missed, below "
                     "which they are dearer than the cheapest even with both rates moved by "
                     f"{margin:.0%}: no rate passed, none is reported (`convergence` column; "
                     "`--set search.screen_margin=0` searches them all)")
    if n:
        notes.append(f"screened: {n} configuration(s) dearer than the cheapest even with both "
                     f"rates moved by {margin:.0%} keep their first answer: not rechecked, no "
                     "seed band (`convergence` column; `--set search.screen_margin=0` checks "
                     "them all)")
    if unbanded:
        notes.append(f"no seed band: {unbanded} rechecked configuration(s) dearer than the "
                     f"cheapest even with both rates moved by {margin:.0%} (`convergence` "
                     "column; `--set search.screen_margin=0` bands them all)")
    moved = [s for s in searches if len(s.lengths) >= 2 and s.lengths[0][1] > 0
             and abs(s.lengths[-1][1] / s.lengths[0][1] - 1.0) > margin]
    if moved:  # screening compared first-length answers: they were not that close
        notes.append(f"WARNING: {len(moved)} answer(s) moved more than screen_margin "
                     f"({margin:.0%}) from the first run length to the last, so a screened "
                     "configuration's first answer may be as far off: lengthen the runs "
                     "(requests_per_run) or widen screen_margin")
    if best is not None and best.get("band_lo") and best["max_rate"] > 0:
        low = 1.0 - best["band_lo"] / best["max_rate"]
        if low > margin:
            notes.append(f"WARNING: the pick's band reaches {low:.0%} below its answer, wider "
                         f"than screen_margin ({margin:.0%}): a screened configuration might tie; "
                         "rerun with a wider screen_margin")
    return notes
