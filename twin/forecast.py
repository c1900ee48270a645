"""The forecast: the workload simulated with the profile, written before the engine serves.

Nothing measured during or after the real runs enters it; at most a speed probe before the first
run scales every step price by the machine's speed against calibration's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.fitted import FittedCostModel, resolve_profile
from twinserve.backends.sim.host_link import HostLink, HostTierExecutor, host_link_from_profile
from twinserve.core.errors import InvalidConfigError
from twinserve.core.engine_core import EngineCore
from twinserve.sim.world import RequestRecord, Simulation
from twinserve.sim.workload import Workload

from twinserve.twin.compare import METRICS, PERCENTILES, per_request, pooled

PROBED = "forecast, probed before"
UNPROBED = "forecast, at the profile's own speed"
NOWCAST = "nowcast (uses the run's own speed)"


def simulate(profile: Any, make: Callable[[], Workload], sched_cfg: Any, spec: Any = None, seed: int = 0) -> Any:
    """The workload simulated with this cost model and scheduler config (a RunResult).

    spec: a SpecForecast, the engine's speculation and the acceptance its verify steps draw from."""
    executor = SimExecutor(profile)
    if spec is not None:
        spec.attach(executor, seed)
    core = EngineCore(dataclasses.replace(sched_cfg), executor,
                      speculative_config=spec.config if spec is not None else None)
    if getattr(sched_cfg, "kv_offloading_blocks", 0):
        core.executor = tier_executor(profile, executor)
    return Simulation(core, executor, make()).run()


def tier_executor(profile: Any, executor: SimExecutor) -> HostTierExecutor:
    """The engine runs a host KV tier: its copies priced on the link the profile measured."""
    meta = getattr(profile, "meta", None) or {}
    link = host_link_from_profile(meta)
    if link is None:
        raise InvalidConfigError("kv_offloading_size", "set", "a profile that timed the host tier's copies: "
                                 "this one has no 'host_link'; run `twinserve calibrate` again (it times them)")
    return HostTierExecutor(executor, HostLink(link["load_bandwidth"], link["load_latency_s"], link["block_bytes"],
                                               link["store_bandwidth"], link["store_latency_s"]),
                            synchronous=bool(link["synchronous"]))


def percentiles(records: Sequence[RequestRecord]) -> dict[str, dict[str, float]]:
    """{metric: {"p50", "p90", "p99"}} in seconds (NaN where there is no value)."""
    out: dict[str, dict[str, float]] = {}
    for m in METRICS:
        v = pooled(records, m)
        out[m] = {f"p{p}": float(np.percentile(v, p)) if len(v) else math.nan for p in PERCENTILES}
    return out


def make_forecast(profile: FittedCostModel, profile_path: str, make: Callable[[], Workload], sched_cfg: Any,
                  engine: dict[str, Any], workload: dict[str, Any], workload_sha: str,
                  probe_s: float | None = None, spec: Any = None) -> tuple[dict[str, Any], Any, FittedCostModel]:
    """(the forecast record, the simulation behind it, the profile at the forecast's prices)."""
    ref = (profile.meta.get("provenance") or {}).get("speed_probe_s")
    ratio = probe_s / float(ref) if probe_s and ref else None  # the machine's slowness now
    priced = dataclasses.replace(profile, time_scale=profile.time_scale * ratio) if ratio else profile
    sim = simulate(priced, make, sched_cfg, spec, int(workload.get("seed") or 0))
    reqs = per_request(sim.records)
    rows = [{"request_id": r.request_id, "arrival_s": r.arrival_time, "prompt_tokens": r.num_prompt_tokens,
             "output_tokens": r.num_output_tokens, **{m: _num(reqs.get(r.request_id, {}).get(m))
                                                      for m in METRICS}}
            for r in sim.records]
    path = resolve_profile(profile_path)
    rec = {"kind": PROBED if ratio else UNPROBED,
           "profile": {"path": str(profile_path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                       "model": profile.model, "hardware": profile.meta.get("hardware"),
                       "date": (profile.meta.get("provenance") or {}).get("date")},
           "speed": {"probe_before_s": probe_s, "probe_profile_s": ref, "ratio": ratio},
           "engine": engine, "workload": {**workload, "sha256": workload_sha},
           "num_requests": sum(not r.warmup for r in sim.records), "num_steps": sim.num_steps,
           "percentiles": {m: {q: _num(v) for q, v in per.items()} for m, per in percentiles(sim.records).items()},
           "requests": rows}
    warm = [r.request_id for r in sim.records if r.warmup]
    if warm:  # closed loop: simulated first, left out of the percentiles and of num_requests
        rec["warmup_request_ids"] = warm
    if spec is not None:
        rec["speculative"] = spec.record()
    return rec, sim, priced


def write_forecast(rec: dict[str, Any], out: Path) -> Path:
    """DIR/forecast.json, written whole (a reader never sees half a forecast)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".forecast.json.tmp"
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return tmp.replace(out / "forecast.json")


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 9)
