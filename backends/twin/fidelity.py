"""`twinserve fidelity`: one workload on the real engine and in the simulator, and how far apart they are.

Both sides get the same arrivals (Poisson at a rate, or the trace's own timestamps), the
same lengths (outputs forced, EOS ignored), the same token ids and the same scheduler
config, KV pool size included. The simulator runs twice: with the fitted profile (the
prediction being judged) and in replay mode on the real run's measured step times (the
schedule must then match exactly, replay.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.fitted import (FittedCostModel, check_profile_core_mode, check_profile_model,
                                           check_profile_numerics, check_profile_parallelism)
from twinserve.core.engine_core import EngineCore
from twinserve.core.errors import TwinserveError
from twinserve.sim.config import load_config
from twinserve.sim.errors import TraceError
from twinserve.sim.world import RequestRecord, Simulation
from twinserve.sim.workload import Workload, WorkloadConfig

from ..real.step_log import StepLog, read_step_log
from .band import StepNoise, band_table, prediction_band
from .calibrate import catalog_name, cold_prefix_cache, speed_probe_parts
from .compare import compare, figure, table
from .hostload import HostLoad, warning
from .realrun import RealRun, run_real
from .replay import replay
from .steps import scaled_profile, speed_ratios, step_errors, step_line


# Rounds of the speed probe before and after a real run (calibrate.speed_probe_parts): about
# 0.4 s each on this project's VM, whose consecutive probes differ by up to ±5%; nine rounds
# give a median over 54 decode steps and 9 prefills where calibration's probes use 3.
PROBE_ROUNDS = 9


class FidelityError(TwinserveError, ValueError):
    """A fidelity run cannot start as asked; the message says what to change."""


@dataclass(slots=True)
class FidelityOptions:
    """What to replay and how."""

    profile: str
    trace: str | None = None
    config: str | None = None          # a study TOML whose [workload] table is replayed
    num_requests: int = 40
    rate: float | None = None          # Poisson arrivals; None = the trace's own timestamps
    time_scale: float = 1.0            # trace timestamps are multiplied by this
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    seed: int = 0
    allow_profile_mismatch: bool = False
    # Scale the simulated step times by the machine's measured speed (a probe run before and
    # after the real run, against the probe recorded at calibration); raw errors are kept too.
    normalize_speed: bool = True
    # Scale decode and a step's prefill share by their own probe parts' drift instead of the
    # whole probe's (steps.scaled_profile). Off by default: on this project's VM it did not
    # predict better (Nov 30: six runs, conv alike, code's prefill steps 2-3 points worse).
    speed_by_part: bool = False


class CappedWorkload(Workload):
    """A workload whose trace lengths are clipped to what the engine can serve in minutes."""

    def __init__(self, cfg: WorkloadConfig, seed: int, max_model_len: int, trace_path: str | None,
                 max_prompt: int | None, max_output: int | None) -> None:
        super().__init__(cfg, seed, max_model_len, trace_path)
        self.max_prompt = max_prompt
        self.max_output = max_output

    def _rows(self) -> Iterator[tuple[float | None, int | None, int | None, str, int]]:
        mp, mo = self.max_prompt, self.max_output
        for arrival, p, o, file, line in super()._rows():
            if p is not None and mp:
                p = min(p, mp)
            if o is not None and mo:
                o = min(o, mo)
            yield arrival, p, o, file, line


def workload_factory(opts: FidelityOptions, max_model_len: int,
                     vocab_size: int) -> Callable[[], Workload]:
    """A function making fresh, identical copies of the workload (one per side)."""
    if opts.config:
        cfg = dataclasses.replace(load_config(opts.config).workload)
        if opts.trace:
            cfg.trace = opts.trace
        if opts.rate is not None:
            cfg.rate = opts.rate
        cfg.num_requests = opts.num_requests
    elif opts.trace:
        cfg = WorkloadConfig(num_requests=opts.num_requests,
                             arrival="trace" if opts.rate is None else "poisson",
                             rate=opts.rate or 1.0, time_scale=opts.time_scale, trace=opts.trace,
                             prompt_dist="trace", output_dist="trace")
    else:
        raise FidelityError("give a workload: --trace FILE (and --rate R for Poisson arrivals) "
                            "or --config STUDY.toml")
    cfg.on_overlong = "fail"
    cfg.vocab_size = min(cfg.vocab_size, vocab_size) if opts.config else vocab_size
    trace = cfg.trace or None

    def make() -> Workload:
        return CappedWorkload(cfg, opts.seed, max_model_len, trace, opts.max_prompt_tokens,
                              opts.max_output_tokens)
    return make


def check_workload(make: Callable[[], Workload], max_model_len: int) -> int:
    """Walk the first turns once (lengths only) so a bad trace fails before anything runs."""
    n = 0
    try:
        for item in make().items():
            n += 1
    except TraceError as e:
        if "max_model_len" in str(e):
            raise FidelityError(f"{e.file}:{e.line}: a request is longer than the engine's "
                                f"max_model_len ({max_model_len}); clip the trace with "
                                "--max-prompt-tokens and --max-output-tokens (for example 512 "
                                "and 96)") from None
        raise
    if n == 0:
        raise FidelityError("the workload has no requests")
    return n


def simulate(profile: FittedCostModel, make: Callable[[], Workload], sched_cfg: Any) -> Any:
    """The prediction: the same scheduler config and workload, priced by the profile."""
    executor = SimExecutor(profile)
    core = EngineCore(dataclasses.replace(sched_cfg), executor)
    return Simulation(core, executor, make(), fast_forward=True).run()


def warm_up(engine: Any) -> None:
    """A few unlogged steps (first-touch allocations), then a cold prefix cache like the simulator's."""
    from twinserve.core.sampling_params import SamplingParams

    engine.set_step_log(StepLog())
    sp = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    for i, n in enumerate((24, 8)):
        engine.add_request(f"fidelity-warm-up-{i}", {"prompt_token_ids": [2 + i] * n}, sp)
    cold_prefix_cache(engine)


def run_fidelity(engine: Any, opts: FidelityOptions, out_dir: str | Path,
                 echo: Callable[[str], None] = print, band_samples: int = 20) -> dict[str, Any]:
    """Replay the workload on engine and in the simulator; write fidelity.json/.md/.png.

    band_samples noisy simulations give the prediction band (band.py); 0 skips it.
    """
    out = Path(out_dir)
    profile = FittedCostModel.load(opts.profile)
    model = catalog_name(engine.model_config, engine.model_name)
    check_profile_model(profile, model, opts.allow_profile_mismatch, source=f"profile {opts.profile}")
    check_profile_parallelism(profile, engine.args.tensor_parallel_size, opts.allow_profile_mismatch,
                              source=f"profile {opts.profile}")
    device = engine.args.resolve_device()
    check_profile_numerics(profile, device.type, str(engine.args.resolve_dtype(device)),
                           opts.allow_profile_mismatch, source=f"profile {opts.profile}",
                           quantization=engine.args.quantization)
    check_profile_core_mode(profile, engine.core_mode, opts.allow_profile_mismatch,
                            source=f"profile {opts.profile}")
    make = workload_factory(opts, engine.max_model_len, engine.vocab_size)
    n_first = check_workload(make, engine.max_model_len)
    out.mkdir(parents=True, exist_ok=True)
    probe_cal = profile.meta.get("provenance", {}).get("speed_probe_s")
    probe = opts.normalize_speed and bool(probe_cal)
    # Warm first: a cold engine's first steps would read as a slower machine.
    warm_up(engine)
    probe_before = speed_probe_parts(engine, rounds=PROBE_ROUNDS) if probe else None
    if probe_before is not None:
        cold_prefix_cache(engine)  # the run starts from a cold prefix cache, like the simulator
    steps_path = out / "steps_real.csv"
    # A core in its own process: the replay takes the core's steps from the log (realrun.py).
    engine.set_step_log(StepLog(steps_path, record_schedule=engine.core_mode == "process"))
    echo(f"fidelity: {n_first} requests on the real engine in real time ...")
    host = HostLoad()
    real: RealRun = run_real(engine, make())
    host_load = host.result()
    engine.step_log.close()
    probe_after = (speed_probe_parts(engine, rounds=PROBE_ROUNDS) if probe_before and not real.interrupted
                   else None)
    sched_cfg = engine.scheduler_config
    echo("fidelity: simulating with the profile, and replaying the measured step times ...")
    raw_profile = dataclasses.replace(profile, time_scale=1.0, prefill_scale=1.0)
    sim_raw = simulate(raw_profile, make, sched_cfg)
    speed: dict[str, Any] = {"normalized": False, "probe_profile_s": probe_cal,
                             "probe_before_s": probe_before.total if probe_before else None,
                             "probe_after_s": probe_after.total if probe_after else None,
                             "probe_before_parts": probe_before.to_dict() if probe_before else None,
                             "probe_after_parts": probe_after.to_dict() if probe_after else None,
                             "host_load": host_load}
    sim = sim_raw
    if probe_before is not None:
        speed.update(normalized=True, **speed_ratios(profile, [probe_before, probe_after]))
        profile = scaled_profile(profile, speed, opts.speed_by_part)
        sim = simulate(profile, make, sched_cfg)
    check = replay(real, make, sched_cfg)
    report: dict[str, Any] = compare(real.records, sim.records)
    raw = compare(real.records, sim_raw.records)
    report["metrics_raw"], report["throughput_raw"] = raw["metrics"], raw["throughput"]
    report["speed"] = speed
    report["num_requests"] = len(real.records)
    report["profile"] = str(opts.profile)
    report["interrupted"] = real.interrupted
    report["replay"] = check.to_dict()
    rows = read_step_log(steps_path) if real.step_starts else []
    report["steps"] = step_errors(profile, rows) if rows else {}
    report["steps_raw"] = step_errors(raw_profile, rows) if rows else {}
    if band_samples:
        report["band"] = prediction_band(profile, make, sched_cfg, real.records,
                                         StepNoise.for_run(profile, speed, rows), samples=band_samples)
    report["real"] = {"num_steps": len(real.step_starts), "wall_s": real.wall_time,
                      "preemptions": real.num_preemptions,
                      "prefix_hit_tokens": sum(r.prefix_hit_tokens for r in real.records)}
    report["sim"] = {"num_steps": sim.num_steps, "preemptions": sim.num_preemptions,
                     "prefix_hit_tokens": sum(r.prefix_hit_tokens for r in sim.records)}
    report["workload"] = {k: v for k, v in dataclasses.asdict(opts).items() if k != "profile"}
    # Everything a later `fidelity --from-run` needs to simulate this workload again.
    report["scheduler_config"] = dataclasses.asdict(sched_cfg)
    report["engine"] = {"model": model, "engine_core_mode": engine.core_mode,
                        "max_model_len": engine.max_model_len, "vocab_size": engine.vocab_size,
                        "device": device.type, "dtype": str(engine.args.resolve_dtype(device)),
                        "max_num_seqs": sched_cfg.max_num_seqs,
                        "max_num_batched_tokens": sched_cfg.max_num_batched_tokens,
                        "enable_prefix_caching": sched_cfg.enable_prefix_caching,
                        "num_blocks": sched_cfg.num_blocks, "block_size": sched_cfg.block_size,
                        "policy": sched_cfg.policy}
    (out / "fidelity.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    md = table(report)
    if speed["normalized"]:
        after = speed["probe_after_s"] or float("nan")
        by_part = (f" (decode {speed['machine_speed_ratio_decode']:.3f}, prefill "
                   f"{speed['machine_speed_ratio_prefill']:.3f}"
                   + ("; scaled by part)" if opts.speed_by_part else ")")
                   if "machine_speed_ratio_decode" in speed else "")
        md = (f"machine speed during the run: {speed['machine_speed_ratio']:.3f} x the calibration's"
              f"{by_part} (speed probe {speed['probe_profile_s']:.3f} s at calibration, "
              f"{speed['probe_before_s']:.3f} s before and {after:.3f} s after this run); simulated "
              "step times scaled by it\n\n" + md + "\n\nwithout the speed scaling:\n\n"
              + table({"metrics": report["metrics_raw"], "throughput": report["throughput_raw"]}))
    rp = check.to_dict()
    md += (f"\n\nreplay mode: {'exact' if rp['exact'] else 'NOT exact'} "
           f"({rp['num_steps_real']} real steps, {rp['num_steps_sim']} replayed; "
           f"max token-time difference {rp['max_token_time_diff_s']:.2e} s)")
    if rp["first_mismatch"]:
        md += f"\nfirst mismatch: {rp['first_mismatch']}"
    md += step_line(report["steps"], "\n")
    if band_samples:
        md += "\n\n" + band_table(report["band"])
    noisy = warning(host_load, "the real run")
    if noisy:
        md += "\n\n" + noisy
    (out / "fidelity.md").write_text(md + "\n")
    _write_requests(real.records, out / "requests_real.csv")
    _write_requests(sim.records, out / "requests_sim.csv")
    figure(real.records, sim.records, out / "fidelity.png",
           title=f"twinserve fidelity: {model}, profile {Path(str(opts.profile)).name}")
    echo(md)
    return report


def _write_requests(records: list[Any], path: Path) -> None:
    import pandas as pd

    rows = [{"request_id": r.request_id, "arrival_s": r.arrival_time, "prompt_tokens": r.num_prompt_tokens,
             "output_tokens": r.num_output_tokens, "first_token_s": r.first_token_time,
             "finish_s": r.finish_time, "prefix_hit_tokens": r.prefix_hit_tokens,
             "preemptions": r.num_preemptions, "finish_reason": r.finish_reason,
             "token_times": json.dumps(r.token_times)} for r in records]
    pd.DataFrame(rows).to_csv(path, index=False)


def _read_requests(path: Path) -> list[RequestRecord]:
    """Records written by _write_requests (token times only where the file has them)."""
    import pandas as pd

    def num(v: Any) -> float | None:
        return None if pd.isna(v) else float(v)

    out = []
    for r in pd.read_csv(path, keep_default_na=True).to_dict("records"):
        times = r.get("token_times")
        out.append(RequestRecord(str(r["request_id"]), float(r["arrival_s"]), int(r["prompt_tokens"]),
                                 int(r["output_tokens"]), None, num(r["first_token_s"]), num(r["finish_s"]),
                                 int(r["prefix_hit_tokens"]), int(r["preemptions"]),
                                 json.loads(times) if isinstance(times, str) else [],
                                 finish_reason=str(r.get("finish_reason") or "")))
    return out


def rejudge(run_dir: str | Path, profile_path: str, out_dir: str | Path, trace: str | None = None,
            model: str | None = None, allow_profile_mismatch: bool = False,
            echo: Callable[[str], None] = print, band_samples: int = 20,
            speed_by_part: bool = False) -> dict[str, Any]:
    """A recorded real run (a fidelity output folder) judged again with another profile, no engine.

    The simulator gets the run's workload (options from its fidelity.json; trace re-pointed
    with `trace` when the run was recorded on another machine) and scheduler config, and its
    prediction is compared with the recorded requests. Runs recorded before the scheduler
    config was saved are rebuilt from the engine settings they saved and the model's config
    (`model`, for its context length and vocabulary). Writes fidelity.json/.md/.png to out_dir.
    """
    from twinserve.backends.real.config import EngineArgs
    from twinserve.backends.real.core_client import scheduler_config_for
    from twinserve.core.sched.config import SchedulerConfig

    run = Path(run_dir)
    try:
        old = json.loads((run / "fidelity.json").read_text())
    except FileNotFoundError:
        raise FidelityError(f"{run}: no fidelity.json (give a folder `twinserve fidelity --out` wrote)") from None
    profile = FittedCostModel.load(profile_path)
    eng = old.get("engine") or {}
    check_profile_model(profile, eng.get("model", ""), allow_profile_mismatch, source=f"profile {profile_path}")
    if eng.get("device") and eng.get("dtype"):
        check_profile_numerics(profile, eng["device"], eng["dtype"], allow_profile_mismatch,
                               source=f"profile {profile_path}")
    check_profile_core_mode(profile, eng.get("engine_core_mode", "inproc"), allow_profile_mismatch,
                            source=f"profile {profile_path}")
    names = {f.name for f in dataclasses.fields(FidelityOptions)} - {"profile"}
    wl = {k: v for k, v in (old.get("workload") or {}).items() if k in names}
    if trace is not None:
        wl["trace"] = trace
    if speed_by_part:
        wl["speed_by_part"] = True
    opts = FidelityOptions(str(profile_path), **wl)
    if old.get("scheduler_config"):
        sched_cfg = SchedulerConfig(**old["scheduler_config"])
        max_len, vocab = int(eng["max_model_len"]), int(eng["vocab_size"])
    else:
        if model is None:
            raise FidelityError(f"{run} was recorded without its scheduler config: give --model (the model "
                                "it ran) so its context length and vocabulary can be read")
        from twinserve.backends.real.engine import _peek_config
        from twinserve.backends.real.models.registry import resolve_model

        cfg = _peek_config(resolve_model(model))
        max_len, vocab = int(cfg.max_position_embeddings), int(cfg.vocab_size)
        args = EngineArgs(model=model, max_num_seqs=eng["max_num_seqs"],
                          max_num_batched_tokens=eng["max_num_batched_tokens"], block_size=eng["block_size"],
                          enable_prefix_caching=eng["enable_prefix_caching"], policy=eng["policy"])
        sched_cfg = scheduler_config_for(args, max_len, int(eng["num_blocks"]))
    make = workload_factory(opts, max_len, vocab)
    real = _read_requests(run / "requests_real.csv")
    speed = old.get("speed") or {}
    ratio = speed.get("machine_speed_ratio") if opts.normalize_speed and speed.get("normalized") else None
    raw_profile = dataclasses.replace(profile, time_scale=1.0, prefill_scale=1.0)
    judged = scaled_profile(profile, speed, opts.speed_by_part) if ratio else raw_profile
    sim_raw = simulate(raw_profile, make, sched_cfg)
    sim = simulate(judged, make, sched_cfg) if ratio else sim_raw
    report: dict[str, Any] = compare(real, sim.records)
    raw = compare(real, sim_raw.records)
    report["metrics_raw"], report["throughput_raw"] = raw["metrics"], raw["throughput"]
    rows = read_step_log(run / "steps_real.csv") if (run / "steps_real.csv").exists() else []
    report["steps"] = step_errors(judged, rows) if rows else {}
    if band_samples:
        report["band"] = prediction_band(judged, make, sched_cfg, real,
                                         StepNoise.for_run(judged, speed if ratio else None, rows),
                                         samples=band_samples)
    report.update(num_requests=len(real), profile=str(profile_path), rejudged_from=str(run),
                  speed={**speed, "from_recorded_run": True}, workload=wl, engine=eng,
                  scheduler_config=dataclasses.asdict(sched_cfg),
                  sim={"num_steps": sim.num_steps, "preemptions": sim.num_preemptions,
                       "prefix_hit_tokens": sum(r.prefix_hit_tokens for r in sim.records)},
                  real=old.get("real"), replay=old.get("replay"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    md = (f"recorded run {run} (real side as measured then) judged with profile {profile_path}"
          + (f"; simulated step times scaled by the run's measured machine speed {ratio:.3f}"
             + (" (decode and prefill by part)" if opts.speed_by_part else "") if ratio else "")
          + "\n\n" + table(report))
    md += step_line(report["steps"], "\n\n")
    if band_samples:
        md += "\n\n" + band_table(report["band"])
    (out / "fidelity.md").write_text(md + "\n")
    _write_requests(sim.records, out / "requests_sim.csv")
    figure(real, sim.records, out / "fidelity.png",
           title=f"twinserve fidelity (recorded run): {eng.get('model', '')}, profile {Path(str(profile_path)).name}")
    echo(md)
    return report


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot serialise {type(o).__name__}")


def exit_code(report: dict[str, Any]) -> int:
    """Non-zero when the run was interrupted."""
    return 130 if report.get("interrupted") else 0


__all__ = ["CappedWorkload", "FidelityError", "FidelityOptions", "run_fidelity", "exit_code",
           "rejudge", "workload_factory"]
