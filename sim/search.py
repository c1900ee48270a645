"""`simulate search`: the highest request rate meeting latency SLOs, per configuration, and its cost.

Per configuration the rate is bracketed from the cost model's steady-state estimate (or
start_rate), then bisected to the tolerance; a run stops once its SLOs are lost for sure
(sim.search_run) and runs go to the pool or Ray as workers free (sim.search_driver).
Cost per million tokens = GPU price per hour / tokens per hour at the max rate * 1e6.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from twinserve.backends.sim.catalog import HARDWARES, UnknownSpecError, get_hardware

from twinserve.sim.build import fit_problem
from twinserve.sim.config import StudyConfig, find_line, replica_config, set_field, source_text
from twinserve.sim.errors import ConfigError
from twinserve.sim.search_disagg import check_disaggregation, with_modes
from twinserve.sim.search_driver import drive
from twinserve.sim.search_run import run_search_point, steady_state
from twinserve.sim.specs import model_label, resolve_hardware
from twinserve.sim.study import grid_points

SLO_METRICS = ("ttft", "tpot", "itl", "e2e", "queue")
SLO_STATS = ("p50", "p90", "p99", "mean")
_REACH_CAP = 2.0  # the most a pass's margins move the next rate up (a miss above stops early)
# Aim a little short of the margins' end: a pass just under the answer then a cheap miss beats a
# miss leaving a wide bracket (FP8 8x H200 question: 0.9, 1.0, 1.05 -> 43.7k, 44.4k, 47.9k requests).
_REACH_AIM = 0.9
# With two passes, the line through their statistics (a secant) places each limit's crossing;
# latencies are convex in the rate (a queue's knee), so it lies at or above the answer (FP8 8x
# H200 question's first length: 0-15% above, one 66%): aim this far along to it (0.9, 0.95, 1.0
# and 1.05 tried there: 0.95 simulated the fewest requests).
_SECANT_AIM = 0.95


def parse_slos(specs: Sequence[str]) -> dict[str, float]:
    """['ttft_p99=2', 'tpot_p99=0.1'] -> {'p99_ttft_s': 2.0, 'p99_tpot_s': 0.1}."""
    out: dict[str, float] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        metric, _, stat = name.strip().partition("_")
        if not sep or metric not in SLO_METRICS or stat not in SLO_STATS:
            raise ConfigError("--slo", f"{spec!r}: write METRIC_STAT=SECONDS with METRIC one of "
                              f"{', '.join(SLO_METRICS)} and STAT one of {', '.join(SLO_STATS)} "
                              "(e.g. ttft_p99=2)")
        try:
            limit = float(value)
        except ValueError:
            raise ConfigError("--slo", f"{spec!r}: {value!r} is not a number of seconds") from None
        if not limit > 0:
            raise ConfigError("--slo", f"{spec!r}: the limit must be > 0 seconds")
        out[f"{stat}_{metric}_s"] = limit
    return out


def meets(row: dict[str, Any], slos: dict[str, float]) -> bool:
    """Every request served and every SLO statistic within its limit (NaN fails)."""
    if row.get("completed", 0) < row.get("num_requests", 0) or row.get("refused", 0):
        return False
    return all(row.get(col) is not None and row[col] <= limit for col, limit in slos.items())


@dataclass(slots=True)
class RateSearch:
    """The bracket of one configuration and every run made for it."""

    point: dict[str, Any]
    cfg: StudyConfig
    lo: float = 0.0            # highest rate that met the SLOs (0: none yet)
    hi: float = math.inf       # lowest rate that missed them
    runs: dict[float, dict[str, Any]] = field(default_factory=dict)
    error: str = ""
    no_fit: str = ""           # why the model does not fit this configuration ('' = it fits)
    # (requests per run, max rate found) per run length tried, shortest first (sim.convergence).
    lengths: list[tuple[int, float]] = field(default_factory=list)
    step: float = 2.0          # factor the bracket grows or shrinks by before it has both ends
    start: float = 0.0         # first rate (0: the driver places it, else search.start_rate)
    estimate: float = 0.0      # the cost model's steady-state rate (sim.search_run), 0 = none
    seeds: list[tuple[int, float]] = field(default_factory=list)  # (seed, max rate) for the band
    seed_resolution: float = 0.0  # relative bracket width the extra seeds were bisected to
    # Work done over every stage (first length, rechecks, seeds): runs and requests simulated.
    runs_total: int = 0
    simulated: int = 0
    integer: bool = False      # the searched value is a client count (search.axis = concurrency)
    screened: bool = False     # cannot be the pick or a tie: not rechecked, no band (sim.search_screen)
    unbanded: bool = False     # rechecked, then out of the pick's reach: no seed band (sim.search_screen)
    # No pass, stopped once a rate it missed showed it dearer than the cheapest (sim.search_screen)
    dominated: bool = False
    tolerance: float = 0.0     # bracket tolerance of this stage (0: search.tolerance)
    # > 0: `estimate` is a nearby answer (a recheck's: the shorter runs'): the driver starts at it
    # times the found/estimated ratio of every such search done so far, with this step.
    near_step: float = 0.0
    first_hi: float = 0.0      # the bracket's top at the first run length (seeds search its grid)
    # > 1 (with near_step): the calibrated start is snapped to estimate x grid^k, so searches
    # land on the grid of the answer they start from (sim.search_band.search_seeds).
    grid: float = 0.0
    held: bool = False         # a recheck's step was kept once on the way down (record)
    # Searches driven together calibrate near starts by their own group only (an extra seed's
    # number: one workload seed moves every configuration alike, another seed otherwise).
    group: int = 0
    lean: bool = False         # its runs' rows are only judged, never written (an extra seed's)
    slos: dict[str, float] = field(default_factory=dict)  # column -> limit (set by run_searches)

    def reach(self) -> float:
        """How far up from lo to aim, by lo's run: the least limit/value over the SLO columns (a
        secant through zero latency at zero rate) times _REACH_AIM; 1 when unknown."""
        row = self.runs.get(self.lo) or {}
        ratios = [limit / v for col, limit in self.slos.items()
                  if isinstance(v := row.get(col), (int, float)) and v > 0]
        return min(ratios) * _REACH_AIM if ratios else 1.0

    def crossing(self) -> float | None:
        """With lo and a pass below it: the least rate, over the SLO columns that rose between
        the two, where the line through their statistics reaches the limit, times
        _SECANT_AIM, over lo; None with one pass or no column that rose (noise near the answer
        can make a nearly flat column's line cross far away: next_rate only lets it pull down)."""
        below = [r for r, x in self.runs.items() if r < self.lo and x.get("meets_slo")]
        if not below:
            return None
        r1 = max(below)
        row, prev = self.runs.get(self.lo) or {}, self.runs[r1]
        out = [(self.lo + (limit - v) * (self.lo - r1) / (v - u)) / self.lo
               for col, limit in self.slos.items()
               if isinstance(v := row.get(col), (int, float))
               and isinstance(u := prev.get(col), (int, float)) and v > u]
        return min(out) * _SECANT_AIM if out else None

    def next_rate(self) -> float | None:
        """The next rate to simulate, or None when the bracket is settled."""
        s = self.cfg.search
        if self.error or self.no_fit:
            return None
        if self.lo == 0.0 and self.hi == math.inf:
            rate = self.start or s.start_rate
        elif self.hi == math.inf:
            if self.lo >= s.max_rate:
                return None
            # A pass far inside its SLOs goes to where its margins run out (on the FP8 question's
            # runs within ~20% of the answer either way); a miss above stops early, so it is cheap.
            rate = self.lo * max(self.step, min(self.reach(), _REACH_CAP))
            if self.grid > 1.0:
                # An extra seed (on its answer's grid) lands within a step or two of its start:
                # a step up settles it in two runs where its margins overshot (FP8 8x H200
                # question: a pass x1.23 up missed and two more runs bisected back).
                rate = self.lo * self.step
            line = self.crossing()
            if line is not None:
                # Two passes: their line's crossing may pull the next rate down (never below one
                # tolerance over lo, so that a miss there settles the bracket).
                rate = min(rate, self.lo * max(1.0 + (self.tolerance or s.tolerance), line))
            rate = min(rate, s.max_rate)
        elif self.lo == 0.0:
            if self.hi <= s.min_rate:
                return None
            rate = max(self.hi / self.step, s.min_rate)
        elif ((self.hi - self.lo) / self.hi <= (self.tolerance or s.tolerance)
              or (self.integer and self.hi - self.lo <= 1)):
            return None
        else:
            rate = (self.lo + self.hi) / 2.0
        if self.integer:  # clients: whole numbers, and never the same count twice
            rate = float(max(1, round(rate)))
            if rate <= self.lo:
                rate = self.lo + 1
            if rate >= self.hi:
                rate = self.hi - 1
            if rate < 1 or (self.hi - self.lo <= 1):
                return None
        rate = float(f"{rate:.6g}")
        return None if rate in self.runs else rate

    def record(self, rate: float, row: dict[str, Any], ok: bool) -> None:
        """Keep the run and narrow the bracket."""
        row = dict(row, meets_slo=ok)
        self.runs[rate] = row
        self.runs_total += 1
        self.simulated += int(row.get("completed") or 0)
        # The same way twice: the first guess was far off, stride out. Down from a recheck's
        # near start (most often within a step or two of its answer) the second miss keeps
        # the step once: a miss stops early (on the FP8 8x H200 question's 600-request runs
        # 0.24 CPU s against a pass's 0.56), and a squared step there overshot to a pass far
        # below the answer, then climbed back by passes.
        down = not ok and self.hi < math.inf and self.lo == 0.0
        if down and self.near_step and self.grid <= 1.0 and not self.held:
            self.held = True
        elif (ok and self.lo > 0.0 and self.hi == math.inf) or down:
            self.step *= self.step
        if ok:
            self.lo = max(self.lo, rate)
        else:
            self.hi = min(self.hi, rate)

    @property
    def status(self) -> str:
        """ok, below min_rate, at max_rate (the cap), or the error."""
        if self.error:
            return "error"
        if self.no_fit:
            return "does not fit"
        if self.lo == 0.0:
            return "dominated" if self.dominated else "no rate meets the SLOs"
        if self.hi == math.inf:
            return "max_rate cap"
        return "ok"


def _with_rate(cfg: StudyConfig, rate: float) -> StudyConfig:
    """A copy of cfg at this load: a request rate, or (axis = concurrency) that many clients."""
    c = copy.deepcopy(cfg)
    if cfg.search.axis == "concurrency":
        set_field(c, "workload.concurrency", int(rate))
    else:
        set_field(c, "workload.rate", rate)
    return c


def check_prices(base: StudyConfig, configs: Sequence[StudyConfig]) -> None:
    """Every [search.prices] name is a GPU of the catalog or of a configuration; a typo is a ConfigError."""
    used = {replica_config(c, i).engine.hardware.lower()
            for c in configs for i in range(max(1, c.cluster.num_replicas))}
    for name in base.search.prices:
        if name.lower() in used:
            continue
        try:
            get_hardware(name)
            continue
        except UnknownSpecError:
            pass
        known = sorted(set(HARDWARES) | {replica_config(c, 0).engine.hardware for c in configs})
        folded = {k.lower(): k for k in known}
        close = difflib.get_close_matches(name.lower(), list(folded), n=1)
        hint = f"did you mean {folded[close[0]]!r}? " if close else ""
        text = source_text(base)
        line = (find_line(text, "search.prices", name) or find_line(text, "search", "prices")) if text else None
        raise ConfigError("search.prices", f"a price for {name!r}, which is no GPU of the catalog or of "
                          f"this study, so it would price nothing; {hint}known: {', '.join(known)}",
                          base.source, line)


def search_rates(base: StudyConfig, grid: dict[str, list[str]], slos: dict[str, float],
                 workers: int | None = None, ray_address: str | None = None,
                 progress: bool = True, tolerance: float = 0.0,
                 settled: Callable[[Any, Sequence[Any]], bool] | None = None) -> list[RateSearch]:
    """Bracket the max rate under the SLOs for every grid point, runs in parallel (to tolerance,
    0 = search.tolerance; settled as sim.search_driver.drive's)."""
    found = "workload.concurrency" if base.search.axis == "concurrency" else "workload.rate"
    if found in grid:
        raise ConfigError(found, f"{found.split('.')[1]} is what search finds; leave it out of "
                          "--grid")
    closed = base.search.axis == "concurrency"
    check_disaggregation(base)
    searches = [RateSearch(p, c, integer=closed, tolerance=tolerance)
                for p, c in with_modes(base, grid_points(base, grid))]
    check_prices(base, [s.cfg for s in searches])
    for s in searches:
        s.no_fit = fit_problem(s.cfg)
        if not s.no_fit and base.search.estimate:
            try:
                rate, batch = steady_state(s.cfg, slos)
                # Closed loop: the clients a replica keeps in flight is the batch it sustains.
                s.estimate = float(batch) if closed else rate
            except Exception:  # noqa: BLE001 - the run itself will report what is wrong
                s.estimate = 0.0
    return run_searches(searches, slos, workers, ray_address, progress, settled=settled)


def run_searches(searches: list[RateSearch], slos: dict[str, float], workers: int | None = None,
                 ray_address: str | None = None, progress: bool = True, desc: str = "search",
                 settled: Callable[[Any, Sequence[Any]], bool] | None = None) -> list[RateSearch]:
    """Run every search's bracket to its end (sim.search_driver), with a progress bar of runs.

    A search marked lean has its runs' rows only judged, never written (sim.search_run.run_search_point)."""
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(desc=desc, unit="run")

    def job(s: RateSearch, rate: float) -> tuple:
        return (dict(s.point, rate=rate), _with_rate(s.cfg, rate), slos, s.cfg.search.early_stop,
                s.lean)

    for s in searches:
        s.slos = slos
    try:
        drive(searches, run_search_point, job, lambda row: meets(row, slos), workers,
              ray_address, bar, settled)
    finally:
        if bar is not None:
            bar.close()
    return searches


def gpu_price(cfg: StudyConfig) -> float:
    """USD per GPU-hour of the config's hardware: [search.prices], else the catalog."""
    name = cfg.engine.hardware
    prices = cfg.search.prices
    if name in prices:
        return prices[name]
    folded = {k.lower(): v for k, v in prices.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    return resolve_hardware(cfg).profile.price_per_hour


def fleet(cfg: StudyConfig) -> tuple[int, float]:
    """(GPUs, USD per hour) of one configuration: every replica's TP x DP x PP GPUs at its GPU's price."""
    gpus, usd = 0, 0.0
    for i in range(max(1, cfg.cluster.num_replicas)):
        rc = replica_config(cfg, i)
        e = rc.engine
        n = e.tensor_parallel_size * e.data_parallel_size * e.pipeline_parallel_size  # as study.py's MFU
        gpus += n
        usd += n * gpu_price(rc)
    return gpus, usd


def served_rate(s: RateSearch) -> float:
    """Requests/s at the answer: the rate itself, or what that many clients completed."""
    if not s.integer or not s.lo:
        return s.lo
    return float(s.runs[s.lo].get("request_throughput") or 0.0)


def summary_rows(searches: Sequence[RateSearch], target_rate: float = 0.0
                 ) -> list[dict[str, Any]]:
    """One row per configuration: max rate under the SLOs, bracket, runs, GPUs and costs."""
    rows = []
    for s in searches:
        row: dict[str, Any] = dict(s.point)
        # A lone replica's cluster.replicas entry is what runs; a cluster is named by its base.
        first = (replica_config(s.cfg, 0) if s.cfg.cluster.num_replicas == 1 else s.cfg).engine
        tp = first.tensor_parallel_size
        row.update(model=model_label(s.cfg, first.model), hardware=first.hardware, tp=tp,
                   max_rate=s.lo, bracket_hi=s.hi, runs=len(s.runs), runs_total=s.runs_total,
                   requests_simulated=s.simulated, status=s.status,
                   error=s.error, no_fit=s.no_fit)
        gpus, usd_h = fleet(s.cfg)
        row["gpus"] = gpus
        row["usd_per_hour"] = usd_h
        best = s.runs.get(s.lo) if s.lo else None
        tok_s = best["total_token_throughput"] if best else 0.0
        out_s = best["output_throughput"] if best else 0.0
        row["tokens_per_s"] = tok_s
        row["tokens_per_s_per_gpu"] = tok_s / gpus if gpus else 0.0
        row["output_tokens_per_s_per_gpu"] = out_s / gpus if gpus else 0.0
        row["usd_per_mtok"] = usd_h / (tok_s * 3600) * 1e6 if tok_s else math.inf
        row["usd_per_mtok_output"] = usd_h / (out_s * 3600) * 1e6 if out_s else math.inf
        rate = served_rate(s)
        row["request_rate"] = rate
        if target_rate > 0:
            n = math.ceil(target_rate / rate) if rate else math.inf
            row["replicas_for_target"] = n
            row["usd_per_hour_for_target"] = n * usd_h if s.lo else math.inf
        rows.append(row)
    return rows


def cheapest(rows: Sequence[dict[str, Any]], target_rate: float = 0.0) -> dict[str, Any] | None:
    """The configuration with the lowest hourly cost for the target (else per token)."""
    key = "usd_per_hour_for_target" if target_rate > 0 else "usd_per_mtok"
    ok = [r for r in rows if r["max_rate"] > 0 and math.isfinite(r[key])]
    return min(ok, key=lambda r: r[key]) if ok else None
