"""Each search answer's band: its spread over seeds and the cost model's measured error.

The seed part is a 95% prediction interval for one more seed's answer, from the answers of
`search.band_seeds` extra seeds searched at the first (short) run length: mean +- t * sd *
sqrt(1 + 1/n), never narrower than the answers themselves, taken relative to their mean and
applied to the final answer. The cost-model part widens it by
the median |throughput error| that `simulate validate` measured for that GPU and model family.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

from twinserve.sim.config import StudyConfig, set_field
from twinserve.sim.convergence import converged_search, with_requests
from twinserve.sim.search import RateSearch, run_searches
from twinserve.sim.search_screen import skip_bands

# Extra seeds bisect on this power of their answer's first-length grid (5% -> ~10% brackets):
# each seed's answer is known to that bracket, which seed_band adds to their spread (the band
# is +-25-50% on the FP8 8x H200 question, so a 10% bracket moves it by a few points). On that
# question 2 made the seed stage 59 -> 51 runs, 12,820 -> 10,653 requests, same pick and ties.
SEED_GRID_POWER = 2

# Student's t, 97.5% quantile by degrees of freedom (any statistics table).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}
DEFAULT_MODEL_ERROR = "simulate-validate/summary.json"


def seed_band(rates: Sequence[float], resolution: float = 0.0) -> tuple[float, float]:
    """(low, high) of a 95% prediction interval for another seed's answer (the rates' own span
    when there is only one). Each rate is known to `resolution` (the bracket's relative width):
    bisected on the same grid, seeds can land on one value, so that error (uniform over the
    bracket, variance w^2 / 12) is added to their spread's."""
    n = len(rates)
    if n < 2:
        return (min(rates), max(rates)) if rates else (0.0, 0.0)
    mean = sum(rates) / n
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1) + (resolution * mean) ** 2 / 12)
    half = _T975.get(n - 1, 1.96) * sd * math.sqrt(1 + 1 / n)
    return max(0.0, min(min(rates), mean - half)), max(max(rates), mean + half)


def seed_step(s: RateSearch, first: float, tol: float) -> float:
    """The answer's own first-length grid step: its bracket (first_hi / first, within the
    tolerance), else twice the tolerance."""
    if first > 0 and math.isfinite(s.first_hi) and s.first_hi > first * (1.0 + 1e-3) \
            and (s.first_hi - first) / s.first_hi <= tol * (1.0 + 1e-9):
        return s.first_hi / first
    return 1.0 + 2 * tol


def seed_grid(step: float, power: int = SEED_GRID_POWER) -> tuple[float, float]:
    """(grid, tolerance) an extra seed's search uses: power first-length grid steps, and the
    relative width of that bracket (a seed settles once its bracket is one grid step wide)."""
    g = step ** max(1, power)
    # 1e-3 over: rates are rounded to six digits (up to 5e-6 of a rate), which can put a
    # bracket one grid step wide a few millionths over 1 - 1/g, and it was bisected once more
    # (a run just under its top).
    return g, (1.0 - 1.0 / g) * (1.0 + 1e-3)


def seed_searches(searches: Sequence[RateSearch]) -> list[tuple[RateSearch, RateSearch]]:
    """(answer, extra seed's search) for every seed of every banded answer, at the first run
    length; each answer's s.seeds starts with its own seed's first-length answer.

    Each extra seed's search starts at its answer times the grid power nearest the ratio the
    searches of its seed done so far found (one workload seed moves every configuration alike),
    on SEED_GRID_POWER steps of the grid of the answer's own bracket, so a seed landing in the
    bracket either side of the start is settled in two runs; s.seed_resolution keeps the seeds'
    bracket width for the band. Each calibrates its start by the searches of its own seed only
    (RateSearch.group), so every seed's searches can share one drive."""
    todo = [s for s in searches if s.status == "ok" and not s.screened and not s.unbanded]
    for s in todo:
        # Short runs: the first length's answers; their spread is the wider one, so the band
        # they give the final answer errs on the safe side.
        s.seeds = [(s.cfg.run.seed, s.lengths[0][1] if s.lengths else s.lo)]
    again: list[tuple[RateSearch, RateSearch]] = []
    for k in range(1, max((s.cfg.search.band_seeds for s in todo), default=0) + 1):
        for s in todo:
            if k > s.cfg.search.band_seeds:
                continue
            n, first = s.lengths[0] if s.lengths else (s.cfg.workload.num_requests, s.lo)
            tol = s.tolerance or s.cfg.search.tolerance
            cfg = with_requests(s.cfg, n)
            set_field(cfg, "run.seed", s.cfg.run.seed + k)
            # A coarser bracket than the answer's own: the band it feeds is wider still, and
            # seed_band adds the bracket's width (s.seed_resolution) to the seeds' spread.
            g, tol = seed_grid(seed_step(s, first, tol))
            s.seed_resolution = max(s.seed_resolution, tol)
            # Only each seed's answer is kept (its runs' rows are judged, never written): lean.
            again.append((s, RateSearch(s.point, cfg, estimate=first, near_step=g, grid=g,
                                        integer=s.integer, tolerance=tol, group=k, lean=True)))
    return again


def record_seeds(again: Sequence[tuple[RateSearch, RateSearch]]) -> None:
    """Each extra seed's answer into its answer's s.seeds, its work into the answer's totals.
    An answer its rechecks left without a pass, or marked unbanded by them (skip_bands), keeps
    no seed at all, as if none had been searched: the work counts, no band is made."""
    for s, r in again:
        s.runs_total += r.runs_total
        s.simulated += r.simulated
        if r.status == "ok":
            s.seeds.append((r.cfg.run.seed, r.lo))
    for s in {id(s): s for s, _ in again}.values():
        if s.status != "ok" or s.unbanded:
            s.seeds, s.seed_resolution = [], 0.0


def search_seeds(searches: Sequence[RateSearch], slos: dict[str, float], workers: int | None,
                 ray_address: str | None, progress: bool) -> None:
    """Search band_seeds more seeds at the first run length (seed_searches); (seed, rate) go
    to s.seeds. Every extra seed's searches in one drive (one pool queue, no barrier between
    seeds: two workers idled on the last search of seed k before seed k + 1 began)."""
    again = seed_searches(searches)
    if not again:
        return
    run_searches([r for _, r in again], slos, workers, ray_address, progress, desc="seeds")
    record_seeds(again)


def banded_search(base: StudyConfig, grid: dict[str, list[str]], slos: dict[str, float],
                  workers: int | None = None, ray_address: str | None = None,
                  progress: bool = True) -> list[RateSearch]:
    """converged_search, then skip_bands and the seed band of every answer left.

    The extra seeds depend only on the first length's answers, so they are driven with the
    first recheck round, in its pool queue (two workers idled at the barrier between the two
    stages, 0.26 worker-s of the FP8 8x H200 question's 19), for every answer the first
    length's screen kept; skip_bands then drops the seeds of answers the rechecks put out of
    reach (record_seeds). Answers with no seeds by then that the staged search would band (no
    recheck, or a capped first answer the rechecks brought under the cap) get theirs after, as
    search_seeds."""
    pending: list[tuple[RateSearch, RateSearch]] = []

    def alongside(searches: list[RateSearch]) -> list[RateSearch]:
        pending.extend(seed_searches(searches))
        return [r for _, r in pending]

    sc = base.search
    searches = converged_search(base, grid, slos, workers, ray_address, progress,
                                alongside if sc.band_seeds else None)
    if sc.band_seeds:
        skip_bands(searches, sc.target_rate, sc.screen_margin)
        record_seeds(pending)
        # An answer with no seeds yet that the staged search would band (a capped first answer
        # the rechecks brought under the cap, or no recheck at all): its seeds now.
        seeded = {id(s) for s, _ in pending}
        rest = [s for s in searches if id(s) not in seeded]
        if any(s.status == "ok" and not s.screened and not s.unbanded for s in rest):
            search_seeds(rest, slos, workers, ray_address, progress)
    return searches


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _gpu(name: str) -> str:
    """The GPU's family and number: 'A100-80GB' and 'a100_sxm' are both 'a100'."""
    m = re.match(r"[a-z]+\d+", name.lower())
    return m.group(0) if m else _norm(name)


def _groups(data: Any) -> list[dict[str, Any]]:
    """summary.json's per backend x system x model entries, as a list of dicts."""
    if isinstance(data, list):
        return [g for g in data if isinstance(g, dict)]
    if isinstance(data, dict):
        # simulate validate's own layout: {"all": {"groups": {"backend | system | model": ...}}}
        if isinstance(data.get("all"), dict) and "groups" in data["all"]:
            return _groups(data["all"]["groups"])
        for key in ("groups", "rows", "summary"):
            if isinstance(data.get(key), list):
                return _groups(data[key])
        out = []
        for key, g in data.items():
            if isinstance(g, dict):
                parts = [p.strip() for p in (key.split("|") if "|" in key else key.split("/"))]
                named = dict(zip(("backend", "system", "model"), parts)) if len(parts) == 3 else {}
                out.append({**named, **g})
        return out
    return []


def _throughput_error(g: dict[str, Any]) -> float | None:
    """The group's median |throughput error| (else TPOT's) as a fraction."""
    for want in ("throughput", "tput", "tpot"):
        for k, v in g.items():
            if "median" in k and want in k and isinstance(v, (int, float)) and math.isfinite(v):
                return abs(v) / 100 if abs(v) > 1 else abs(v)  # percent or fraction
        sub = g.get(want)
        if isinstance(sub, dict):
            for k, v in sub.items():
                if "median" in k and isinstance(v, (int, float)) and math.isfinite(v):
                    return abs(v) / 100 if abs(v) > 1 else abs(v)
    return None


def model_error(cfg: StudyConfig, model: str, hardware: str) -> tuple[float | None, str]:
    """(median |error| of the cost model for this GPU and model family, how it was found)."""
    path = Path(cfg.search.model_error or DEFAULT_MODEL_ERROR)
    if not path.is_absolute() and cfg.search.model_error and cfg.source:
        path = Path(cfg.source).parent / path
    try:
        groups = _groups(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None, "cost-model error: unknown (no validate rows)"
    fam, hw = _norm(model), _gpu(hardware)
    hits = [(g, e) for g in groups
            if fam and fam in _norm(str(g.get("model", ""))) and hw == _gpu(str(g.get("system", "")))
            and (e := _throughput_error(g)) is not None]
    if not hits:
        return None, f"cost-model error: unknown (no validate rows for {model} on {hardware} in {path})"
    # vLLM rows first: the commands this search prints are vLLM's.
    hits.sort(key=lambda ge: str(ge[0].get("backend", "")) != "vllm")
    g, e = hits[0]
    return e, (f"cost-model error {e:.0%} (median |throughput error|, {g.get('backend', '?')} "
               f"{g.get('system', '?')} {g.get('model', '?')}, {path})")


def add_bands(rows: list[dict[str, Any]], searches: Sequence[RateSearch], base: StudyConfig,
              target_rate: float) -> list[str]:
    """Band columns on each row; replicas and costs from the band's low end. Returns notes."""
    notes: set[str] = set()
    for s, row in zip(searches, rows):
        if not s.lo:
            row.update(band_lo=0.0, band_hi=0.0, seed_rates="", model_error=math.nan)
            continue
        rates = [r for _, r in s.seeds] or [s.lo]
        # The seeds were bisected to their own brackets (sim.search_band.search_seeds), no
        # narrower than the first length's tolerance (seed 0's answer).
        res = max(s.seed_resolution, s.tolerance or s.cfg.search.tolerance)
        lo, hi = seed_band(rates, res if s.seeds else 0.0)
        mean = sum(rates) / len(rates)
        lo, hi = s.lo * lo / mean, s.lo * hi / mean  # the short runs' relative spread
        err, note = model_error(base, row["model"], row["hardware"])
        notes.add(note)
        if err is not None:
            lo, hi = lo * (1 - err), hi * (1 + err)
        row.update(band_lo=lo, band_hi=hi, model_error=err if err is not None else math.nan,
                   seed_rates=" ".join(f"{seed}:{r:.3g}" for seed, r in s.seeds))
        usd_h = row["usd_per_hour"]
        scale = s.lo / lo if lo else math.inf
        row["usd_per_mtok_band"] = (row["usd_per_mtok"] / (hi / s.lo) if hi else math.inf,
                                    row["usd_per_mtok"] * scale)
        if target_rate > 0:
            per = row["request_rate"] / s.lo  # req/s per unit searched (1 for rates)
            n_lo = math.ceil(target_rate / (lo * per)) if lo else math.inf
            n_hi = math.ceil(target_rate / (hi * per)) if hi else math.inf
            row["replicas_for_target"] = n_lo
            row["usd_per_hour_for_target"] = n_lo * usd_h
            row["usd_per_hour_band"] = (n_hi * usd_h, n_lo * usd_h)
    return sorted(notes)


def cost_range(row: dict[str, Any], target_rate: float) -> tuple[float, float]:
    """(best, worst) cost of a row over its band: USD/hour for the target, else per M tokens."""
    key = "usd_per_hour_band" if target_rate > 0 else "usd_per_mtok_band"
    if key in row:
        return row[key]
    v = row["usd_per_hour_for_target" if target_rate > 0 else "usd_per_mtok"]
    return v, v


def ties(rows: Sequence[dict[str, Any]], best: dict[str, Any] | None,
         target_rate: float) -> list[dict[str, Any]]:
    """Rows whose best cost within their band is no more than the pick's worst: not told apart."""
    if best is None:
        return []
    worst = cost_range(best, target_rate)[1]
    return [r for r in rows if r is not best and r["max_rate"] > 0
            and math.isfinite(cost_range(r, target_rate)[0])
            and cost_range(r, target_rate)[0] <= worst]
