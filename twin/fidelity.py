"""`twinserve fidelity`: forecast a workload, then serve it N times and judge the forecast.

Phases: checks, warm-up and speed probe, the forecast (written before any real run), the runs
(each from a cold prefix cache), the verdict. Ctrl-C judges the runs completed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

from twinserve.backends.real.step_log import StepLog, read_step_log
from twinserve.backends.sim.fitted import FittedCostModel
from twinserve.sim.clients import closed_loop_line

from twinserve.twin.calibrate import cold_prefix_cache, speed_probe_parts
from twinserve.twin.compare import compare
from twinserve.twin.forecast import make_forecast, percentiles, simulate, write_forecast
from twinserve.backends.real.hostload import HostLoad
from twinserve.twin.preflight import EngineFacts, check_flags, check_profile, engine_facts, mismatches
from twinserve.twin.realrun import RealRun, run_real
from twinserve.twin.report import (banner, excluded_line, forecast_table, free_running_line, nowcast_line, pi_count,
                                   profile_validity, summary_line, verdict_table)
from twinserve.twin.schedule import free_running, schedule_equivalence
from twinserve.twin.specforecast import spec_forecast
from twinserve.twin.steps import step_errors, step_line
from twinserve.twin.verdict import judge
from twinserve.twin.workload import FidelityOptions, check_workload, options_record, workload_factory, workload_hash

PROBE_ROUNDS = 9  # of the speed probe before the first run (calibrate.speed_probe_parts)
INTERRUPTED, FAILED = 130, 3  # exit status: a run cut short (Ctrl-C); with --fail-on-fail, a cell FAILs


def warm_up(engine: Any) -> None:
    """A few unlogged steps, then a cold prefix cache like the simulator's."""
    from twinserve.core.sampling_params import SamplingParams

    engine.set_step_log(StepLog())
    sp = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    for i, n in enumerate((24, 8)):
        engine.add_request(f"fidelity-warm-up-{i}", {"prompt_token_ids": [2 + i] * n}, sp)
    cold_prefix_cache(engine)


def engine_record(engine: Any, facts: EngineFacts) -> dict[str, Any]:
    """The engine's config as forecast.json and fidelity.json record it."""
    keys = ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "num_blocks", "block_size", "policy")
    return {**dataclasses.asdict(facts), "engine_core_mode": facts.core_mode,
            **{k: getattr(engine.scheduler_config, k) for k in keys}}


def forecast_phase(engine: Any, opts: FidelityOptions, out: Path,
                   echo: Callable[[str], None] = print) -> tuple[dict[str, Any], Any, Callable[[], Any], Any]:
    """Checks, warm-up, the probe before, and DIR/forecast.json: (forecast, simulation, workload factory, priced profile)."""
    check_flags(opts.repeats, opts.rate, opts.num_requests, opts.time_scale, opts.trace_offset)
    profile = FittedCostModel.load(opts.profile)
    facts = engine_facts(engine.args)
    check_profile(profile, facts, f"profile {opts.profile}", opts.allow_profile_mismatch)
    make = workload_factory(opts, engine.max_model_len, engine.vocab_size)
    check_workload(make, engine.max_model_len)
    spec = spec_forecast(engine.args.speculative_config, opts.acceptance_from, out)
    warm_up(engine)
    probe = None
    if opts.probe and (profile.meta.get("provenance") or {}).get("speed_probe_s"):
        parts = speed_probe_parts(engine, rounds=PROBE_ROUNDS)
        probe = parts.total if parts else None
    fc, sim, priced = make_forecast(profile, opts.profile, make, engine.scheduler_config, engine_record(engine, facts),
                            options_record(opts, runs=False), workload_hash(make), probe, spec)
    write_forecast(fc, out)
    for line in profile_validity(profile.meta, fc["speed"]["ratio"]):
        echo(line)
    if spec is not None:
        echo(f"forecast with speculation: {spec.config.method} k={spec.config.num_speculative_tokens}, acceptance "
             f"{spec.rates[0]:.3f} per position from the earlier run {spec.source}")
    echo(forecast_table(fc["percentiles"], fc["kind"]))
    return fc, sim, make, priced, spec


@dataclasses.dataclass(slots=True)
class _Run:
    dir: Path
    real: RealRun
    host_load: dict[str, Any] | None
    rows: list[dict[str, Any]]


def serve_phase(engine: Any, opts: FidelityOptions, make: Callable[[], Any], out: Path,
                echo: Callable[[str], None] = print) -> list[_Run]:
    """The workload served `repeats` times, each from a cold prefix cache; stops at a Ctrl-C."""
    runs: list[_Run] = []
    for j in range(opts.repeats):
        run_dir = out if j == 0 else out / f"repeat-{j + 1}"
        run_dir.mkdir(parents=True, exist_ok=True)
        cold_prefix_cache(engine)
        steps_path = run_dir / "steps_real.csv"
        # Core process: the schedule check takes the core's steps from the log.
        engine.set_step_log(StepLog(steps_path, record_schedule=engine.core_mode == "process"))
        echo(f"fidelity: run {j + 1} of {opts.repeats} on the real engine in real time ...")
        host = HostLoad()
        real = run_real(engine, make())
        engine.step_log.close()
        write_requests(real.records, run_dir / "requests_real.csv")
        runs.append(_Run(run_dir, real, host.result(), read_step_log(steps_path) if real.step_starts else []))
        if real.interrupted:
            break
    return runs


def judge_phase(opts: FidelityOptions, fc: dict[str, Any], fsim: Any, priced: FittedCostModel,
                make: Callable[[], Any], sched_cfg: Any, runs: list[_Run], out: Path,
                mismatch: list[str], spec: Any = None) -> tuple[dict[str, Any], str]:
    """The forecast against every completed run: fidelity.json's record and the report's text."""
    done = [r for r in runs if not r.real.interrupted]
    n_req = fc["num_requests"]
    verdict = judge(fc["percentiles"], [percentiles(r.real.records) for r in done], n_req)
    first = done[0] if done else None
    report: dict[str, Any] = {"forecast": {"kind": fc["kind"], "file": "forecast.json", "speed": fc["speed"]},
                              "num_requests": n_req, "profile": opts.profile,
                              "interrupted": any(r.real.interrupted for r in runs),
                              "workload": {**options_record(opts), "sha256": fc["workload"]["sha256"]},
                              "engine": fc["engine"],
                              "scheduler_config": dataclasses.asdict(sched_cfg)}
    metrics: dict[str, Any] = {}
    for m, per in verdict["cells"].items():
        metrics[m] = {}
        for q, cell in per.items():
            real = [v for v in cell["real"] if v is not None and v > 0]
            geo = math.exp(sum(math.log(v) for v in real) / len(real)) if real else None
            sim = cell["forecast"]
            metrics[m][q] = {"real": geo, "sim": sim, "verdict": cell,
                             "err": sim / geo - 1 if geo and sim is not None else None}
    report["metrics"] = metrics
    report["summary"] = verdict["summary"]
    report["banner"] = banner(mismatch, [r.host_load for r in runs], n_req, len(done), fc["kind"],
                              profile_validity(priced.meta, fc["speed"]["ratio"]))
    per_run = []
    for r in done:
        check = schedule_equivalence(r.real, make, sched_cfg).to_dict()
        per_run.append({"dir": str(r.dir.relative_to(out)) if r.dir != out else ".", "host_load": r.host_load,
                        "wall_s": r.real.wall_time, "schedule": check,
                        "percentiles": percentiles(r.real.records),
                        "throughput_err": compare(r.real.records, fsim.records)["throughput"]["output_tok_s"]["err"]})
    report["repeats"] = {"count": len(done), "runs": per_run}
    wcfg = make().cfg
    if wcfg.concurrency:  # the client model both sides ran
        report["closed_loop"] = {"concurrency": wcfg.concurrency, "think_time_s": wcfg.think_time_s,
                                 "warmup_requests": wcfg.warmup_requests}
        report["banner"].append(closed_loop_line(wcfg) + ", in the forecast and in every run")
    excluded = excluded_line(verdict["cells"])
    lines = report["banner"] + ["", verdict_table(verdict["cells"]), "",
                                summary_line(verdict["summary"], pi_count(verdict["cells"]))]
    lines += [excluded] if excluded else []
    if first is not None:
        report["schedule"] = per_run[0]["schedule"]
        report["steps"] = step_errors(priced, first.rows) if first.rows else {}
        report["free_running"] = free_running(first.rows, first.real.records, fsim.records, make, sched_cfg, priced,
                                              spec, opts.seed)
        eq = sum(p["schedule"]["equivalent"] for p in per_run)
        lines += ["", f"schedule equivalence (a plumbing check, not timing evidence): {eq} of {len(per_run)} runs "
                  "scheduled identically on their own step times", free_running_line(report["free_running"])]
        lines[-1] += step_line(report["steps"], "\n")
        report["throughput"] = compare(first.real.records, fsim.records)["throughput"]
    if opts.nowcast and done:
        report["nowcast"] = nowcast(priced, make, sched_cfg, done, spec, opts.seed)
        lines += ["", nowcast_line(report["nowcast"])]
    return report, "\n".join(lines)


def nowcast(priced: FittedCostModel, make: Callable[[], Any], sched_cfg: Any, runs: list[_Run], spec: Any = None,
            seed: int = 0) -> list[dict[str, Any]]:
    """Each run priced at its own measured speed: what step shapes leave once speed is known. Not a forecast."""
    out = []
    for r in runs:
        busy = step_errors(priced, r.rows).get("busy_err") if r.rows else None
        if busy is None or busy <= -1:
            continue
        scaled = dataclasses.replace(priced, time_scale=priced.time_scale / (1.0 + busy))
        c = compare(r.real.records, simulate(scaled, make, sched_cfg, spec, seed).records)["metrics"]
        out.append({"time_scale": scaled.time_scale, "err_p50": {m: v["p50"]["err"] for m, v in c.items()}})
    return out


def run_fidelity(engine: Any, opts: FidelityOptions, out_dir: str | Path, echo: Callable[[str], None] = print,
                 forecast_only: bool = False) -> dict[str, Any]:
    """Forecast, serve, judge; writes forecast.json, fidelity.json/.md and per-run CSVs to out_dir."""
    out = Path(out_dir)
    fc, fsim, make, priced, spec = forecast_phase(engine, opts, out, echo)
    if forecast_only:
        return {"forecast": fc}
    runs = serve_phase(engine, opts, make, out, echo)
    write_requests(fsim.records, out / "requests_forecast.csv")
    mismatch = mismatches(FittedCostModel.load(opts.profile), engine_facts(engine.args)) \
        if opts.allow_profile_mismatch else []
    report, md = judge_phase(opts, fc, fsim, priced, make, engine.scheduler_config, runs, out, mismatch, spec)
    (out / "fidelity.json").write_text(json.dumps(strict_json(report), indent=2, default=_json_default,
                                                  allow_nan=False) + "\n")
    (out / "fidelity.md").write_text(md + "\n")
    echo(md)
    return report


def exit_code(report: dict[str, Any], fail_on_fail: bool = False) -> int:
    """INTERRUPTED when a run was cut short; FAILED with fail_on_fail when a cell FAILs; else 0."""
    if report.get("interrupted"):
        return INTERRUPTED
    return FAILED if fail_on_fail and (report.get("summary") or {}).get("fail") else 0


def write_requests(records: list[Any], path: Path) -> None:
    """Request records as CSV (token times as JSON)."""
    import pandas as pd

    rows = [{"request_id": r.request_id, "arrival_s": r.arrival_time, "prompt_tokens": r.num_prompt_tokens,
             "output_tokens": r.num_output_tokens, "first_token_s": r.first_token_time,
             "finish_s": r.finish_time, "prefix_hit_tokens": r.prefix_hit_tokens,
             "preemptions": r.num_preemptions, "finish_reason": r.finish_reason,
             "token_times": json.dumps(r.token_times)} for r in records]
    pd.DataFrame(rows).to_csv(path, index=False)


def strict_json(o: Any) -> Any:
    """o with every NaN or infinity as None: fidelity.json stays JSON that strict parsers read."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: strict_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [strict_json(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    return str(o) if isinstance(o, Path) else o.item()  # numpy scalars
