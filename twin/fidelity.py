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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from twinserve.backends.sim.fitted import (FittedCostModel, check_profile_code_path, check_profile_core_mode,
                                           check_profile_hardware, check_profile_model, check_profile_numerics,
                                           check_profile_parallelism, recorded_small_batch_rows)
from twinserve.core.errors import TwinserveError
from twinserve.sim.config import load_config
from twinserve.sim.errors import TraceError
from twinserve.sim.world import RequestRecord
from twinserve.sim.workload import Workload, WorkloadConfig

from twinserve.backends.real.step_log import StepLog, read_step_log
from twinserve.twin.band import StepNoise, band_table, prediction_band
from twinserve.twin.calibrate import ProbeParts, catalog_name, cold_prefix_cache, cpu_features, device_name, speed_probe_parts
from twinserve.twin.compare import (DEFAULT_TARGETS, METRICS, PERCENTILES, TARGET_METRICS, compare, figure, table, target_line,
                      targets)
from twinserve.twin.hostload import HostLoad, warning
from twinserve.twin.realrun import RealRun, run_real
from twinserve.twin.replay import replay
from twinserve.twin.speedtrace import (SAMPLE_EVERY_S, SMOOTH_S, SpeedTrace, prefill_sampler_for, run_simulation, sampler_for,
                         sampler_kind, without_sample_pauses)
from twinserve.twin.steps import scaled_profile, speed_ratios, step_errors, step_line


# Rounds of the speed probe before and after a real run (calibrate.speed_probe_parts): about
# 0.4 s each on this project's VM, whose consecutive probes differ by up to ±5%; nine rounds
# give a median over 54 decode steps and 9 prefills where calibration's probes use 3.
PROBE_ROUNDS = 9


class FidelityError(TwinserveError, ValueError):
    """A fidelity run cannot start as asked; the message says what to change."""


SPEED_SOURCES = ("auto", "samples", "probes")


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
    # Times the real engine replays the workload (each run judged at its own measured speed);
    # more than one adds the real runs' differences from each other to the report.
    repeats: int = 1
    # What the machine's speed during a run is read from: "probes" (before and after it),
    # "samples" (speedtrace.py: sampled all through the run, each simulated step priced at the
    # speed at its start; where the profile or the engine cannot, the probes), or "auto": the
    # samples when the profile's reference was taken by the weights sampler, else the probes.
    # On Dec 1 twelve runs judged with their study's own profile met 25 of 36 target cells by
    # the weights sampler's samples and 10 by the probes; an earlier study's twelve, sampled by
    # the 64 MiB product (the matvec sampler), 12 by its samples and 21 by the probes.
    speed_from: str = "auto"
    sample_every_s: float = SAMPLE_EVERY_S
    # Where the profile has a prefill sampler's reference (speedtrace.PrefillSampler), also sample
    # with it and price each step's prefill share at its speed; off (the default): every step at
    # the weights sampler's. On Dec 2 the split priced six runs' steps 7.0% rms per 20 s window
    # off, the weights samples alone 5.2% (docs/twin-log.md, "A compute-bound sample for prefill").
    prefill_samples: bool = False

    def __post_init__(self) -> None:
        if self.speed_from not in SPEED_SOURCES:
            raise FidelityError(f"--speed-from {self.speed_from!r}: give one of {', '.join(SPEED_SOURCES)}")
        if not self.sample_every_s > 0:
            raise FidelityError(f"--sample-every {self.sample_every_s}: give seconds > 0 "
                                "(--speed-from probes samples nothing)")


def uses_samples(speed_from: str, profile: FittedCostModel) -> bool:
    """Whether a run is judged by its speed samples: asked for, or by default ("auto") where the
    profile's reference sample was taken by the weights sampler."""
    prov = profile.meta.get("provenance", {})
    return speed_from == "samples" or (speed_from == "auto" and bool(prov.get("speed_sample_s"))
                                       and sampler_kind(prov) == "weights")


class CappedWorkload(Workload):
    """A workload whose trace lengths are clipped to what the engine can serve in minutes."""

    def __init__(self, cfg: WorkloadConfig, seed: int, max_model_len: int, trace_path: str | None,
                 max_prompt: int | None, max_output: int | None) -> None:
        super().__init__(cfg, seed, max_model_len, trace_path)
        self.max_prompt = max_prompt
        self.max_output = max_output

    def _rows(self) -> Iterator[tuple]:
        mp, mo = self.max_prompt, self.max_output
        for arrival, p, o, *rest in super()._rows():  # rest: where the row came from, its id
            if p is not None and mp:
                p = min(p, mp)
            if o is not None and mo:
                o = min(o, mo)
            yield (arrival, p, o, *rest)


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


def simulate(profile: FittedCostModel, make: Callable[[], Workload], sched_cfg: Any,
             trace: SpeedTrace | None = None) -> Any:
    """The prediction: the same scheduler config and workload, priced by the profile (at the
    speed a run sampled, over its clock, when given its trace)."""
    return run_simulation(profile, sched_cfg, make(), trace)


def sampled_trace(profile: FittedCostModel, speed: dict[str, Any], prefill: bool = False) -> SpeedTrace | None:
    """The speed a run sampled (speedtrace.py) against this profile's reference sample, or None
    when the run sampled nothing, the profile recorded no reference, or the two were sampled
    by different kinds of sampler. Smoothed as the profile's own samples were (the mean for
    profiles that do not say), so the run's speed and the reference agree on a steady machine.
    With the prefill sampler's trace beside it (steps' prefill shares at its speed) when
    `prefill` and both the run and the profile have that kind's samples."""
    s = speed.get("sampled") or {}
    prov = profile.meta.get("provenance", {})
    ref = prov.get("speed_sample_s")
    if not s.get("samples") or not ref or sampler_kind(s) != sampler_kind(prov):
        return None
    every, window, smoothing = (s.get("every_s", SAMPLE_EVERY_S), s.get("window_s", SMOOTH_S),
                                prov.get("speed_sample_smoothing", "mean"))
    trace = SpeedTrace.from_samples(s["samples"], ref, every, window, smoothing)
    ref_p = prov.get("prefill_speed_sample_s")
    if (prefill and ref_p and s.get("prefill_samples")
            and s.get("prefill_sampler") == prov.get("prefill_speed_sampler")):
        trace = trace.with_prefill(SpeedTrace.from_samples(s["prefill_samples"], ref_p, every, window, smoothing))
    return trace


def warm_up(engine: Any) -> None:
    """A few unlogged steps (first-touch allocations), then a cold prefix cache like the simulator's."""
    from twinserve.core.sampling_params import SamplingParams

    engine.set_step_log(StepLog())
    sp = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    for i, n in enumerate((24, 8)):
        engine.add_request(f"fidelity-warm-up-{i}", {"prompt_token_ids": [2 + i] * n}, sp)
    cold_prefix_cache(engine)


def verdict(report: dict[str, Any], limits: dict[str, float] | None = None,
            speed_matched: bool = False) -> dict[str, Any] | None:
    """The report's targets (compare.targets): on the runs pooled, beside the real runs' own
    spread, when the engine ran the workload more than once; else on the one run. With
    speed_matched, the same for the prediction at each run's own mean speed (None without it)."""
    rep = report.get("repeats")
    tag = "; each run at its own mean speed, not a prediction" if speed_matched else ""
    if rep:
        metrics = (rep.get("pooled_speed_matched") or {}).get("metrics") if speed_matched \
            else rep["pooled"]["metrics"]
        return targets(metrics, limits, rep["real_spread"],
                       f"pooled over {rep['count']} real runs{tag}") if metrics else None
    metrics = (report.get("speed_matched") or {}).get("metrics") if speed_matched else report["metrics"]
    return targets(metrics, limits, judged_on=f"the run{tag}") if metrics else None


# The step-price error at which price_sensitivity simulates (either side of the judged prices).
SENSITIVITY_DELTA = 0.05


def price_sensitivity(judged: FittedCostModel, make: Callable[[], Workload], sched_cfg: Any,
                      limits: dict[str, float] | None = None,
                      delta: float = SENSITIVITY_DELTA, trace: SpeedTrace | None = None) -> dict[str, Any]:
    """How far each target metric moves per error in every step price, from two simulations at
    the judged prices x (1 - delta) and x (1 + delta).

    elasticity: d log(metric) / d log(price) over that span. At a light load every latency
    scales with the steps (about 1); near saturation queueing multiplies it, and a few percent
    on the machine's mean speed moves TTFT by tens of percent. speed_precision: per target
    cell, the error in the run's mean speed that alone would use up the cell's limit
    (limit / |elasticity|; None where the metric does not move or has no value); tightest: the
    smallest.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta {delta}: give a fraction in (0, 1)")
    limits = dict(limits or DEFAULT_TARGETS)
    lo, hi = (simulate(dataclasses.replace(judged, time_scale=judged.time_scale * f), make, sched_cfg, trace)
              for f in (1.0 - delta, 1.0 + delta))
    moved = compare(lo.records, hi.records)["metrics"]
    span = math.log((1.0 + delta) / (1.0 - delta))
    elasticity = {m: {q: math.log1p(moved[m][q]["err"]) / span for q in limits} for m in TARGET_METRICS}
    # None where the metric does not move, or has no value (TPOT of one-token outputs is NaN).
    precision = {m: {q: (lim / abs(e) if math.isfinite(e) and e else None)
                     for q, lim in limits.items() for e in (elasticity[m][q],)} for m in TARGET_METRICS}
    cells = [(v, m, q) for m, per in precision.items() for q, v in per.items() if v is not None]
    tight = min(cells) if cells else None
    return {"delta": delta, "elasticity": elasticity, "speed_precision": precision,
            "tightest": {"speed_precision": tight[0], "metric": tight[1], "percentile": tight[2]}
            if tight else None}


def sensitivity_line(s: dict[str, Any]) -> str:
    """One line: each target metric's elasticity, and the speed precision the targets need."""
    el = s["elasticity"]
    qs = "/".join(next(iter(el.values())))
    parts = ", ".join(f"{m.upper()} by " + "/".join(f"{el[m][q]:.2f}%" for q in el[m]) for m in el)
    line = (f"sensitivity (simulated at step prices x {1 - s['delta']:g} and x {1 + s['delta']:g}): "
            f"a 1% error on every step price moves ({qs}) {parts}")
    t = s["tightest"]
    if t:
        line += (f"; to meet every target the run's mean speed must be known within "
                 f"{t['speed_precision']:.1%} ({t['metric'].upper()} {t['percentile']})")
    return line


def sampled_line(speed: dict[str, Any]) -> str:
    """The report's line on the machine speed a run sampled and the prediction priced at it."""
    s = speed["sampled"]
    probes = (f"; the probes before and after it said x {speed['machine_speed_ratio']:.3f}"
              if speed.get("machine_speed_ratio") else "")
    pre = s.get("prefill")
    also = (f"; its prefill shares by the {s.get('prefill_sampler')} sampler after each "
            f"({pre['pause_s'] * 1e3:.1f} ms, x {pre['min_factor']:.3f} to x {pre['max_factor']:.3f})" if pre else "")
    return (f"machine speed during the run: sampled {s['num_samples']} times (every {s['every_s']:g} s "
            f"while busy, {s['pause_s'] * 1e3:.1f} ms each, by the {sampler_kind(s)} sampler), "
            f"x {s['mean_factor']:.3f} the calibration's slowness on average over its steps (over "
            f"{s['window_s']:g} s windows, by their {s.get('smoothing', 'mean')}, x {s['min_factor']:.3f} to "
            f"x {s['max_factor']:.3f}){also}{probes}; "
            "every simulated step priced at the speed sampled at its start")


def speed_matched_line(report: dict[str, Any]) -> str:
    """The targets at the runs' own mean speed, with the time scale that matched it (or "")."""
    t = report.get("targets_speed_matched")
    if not t:
        return ""
    rep = report.get("repeats")
    scales = [r.get("speed_matched_scale") for r in rep["runs"]] if rep else \
        [report["speed_matched"]["time_scale"]]
    sampled = (report.get("speed") or {}).get("sampled") or {}
    on = " the calibration's prices" + (", at the speed sampled through it" if "mean_factor" in sampled else "")
    return ("\n\nwith every step price scaled so the run's own steps cost what they measured in sum "
            "(x " + ", ".join(f"{x:.3f}" for x in scales if x is not None) + on + "): "
            "what the step shapes leave once the machine's speed during the run is known, "
            "which the probes or samples only estimate\n" + target_line(t))


def run_fidelity(engine: Any, opts: FidelityOptions, out_dir: str | Path,
                 echo: Callable[[str], None] = print, band_samples: int = 20,
                 limits: dict[str, float] | None = None) -> dict[str, Any]:
    """Replay the workload on engine and in the simulator; write fidelity.json/.md/.png.

    band_samples noisy simulations give the prediction band (band.py); 0 skips it. With
    opts.repeats > 1 the real engine replays the workload that many times, back to back (the
    speed probe between two runs serves both); the first run is the report's main one and the
    others go to DIR/repeat-J. The report then adds each run's error, the error pooled over
    the runs, and how far the real runs land from each other: the floor no prediction can
    beat on this machine.
    """
    if opts.repeats < 1:
        raise FidelityError(f"--repeats {opts.repeats}: give 1 or more")
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
    small_rows = engine.args.resolve_small_batch_rows(device)
    check_profile_code_path(profile, small_rows, opts.allow_profile_mismatch, source=f"profile {opts.profile}")
    hardware, cpu = device_name(device), (cpu_features() if device.type == "cpu" else None)
    check_profile_hardware(profile, hardware, cpu, opts.allow_profile_mismatch, source=f"profile {opts.profile}")
    make = workload_factory(opts, engine.max_model_len, engine.vocab_size)
    n_first = check_workload(make, engine.max_model_len)
    out.mkdir(parents=True, exist_ok=True)
    prov = profile.meta.get("provenance", {})
    probe = opts.normalize_speed and bool(prov.get("speed_probe_s"))
    # The machine's speed sampled all through the run, when the profile has a reference sample
    # (asked for explicitly, samples are still taken only against one).
    use_samples = uses_samples(opts.speed_from, profile)
    sampler = (sampler_for(engine, sampler_kind(prov)) if opts.normalize_speed and use_samples
               and prov.get("speed_sample_s") else None)
    prefill_sampler = (prefill_sampler_for(engine) if sampler is not None and opts.prefill_samples
                       and prov.get("prefill_speed_sample_s") else None)
    sched_cfg = engine.scheduler_config
    # Warm first: a cold engine's first steps would read as a slower machine.
    warm_up(engine)
    probe_before = speed_probe_parts(engine, rounds=PROBE_ROUNDS) if probe else None
    runs: list[_Run] = []
    for j in range(opts.repeats):
        run_dir = out if j == 0 else out / f"repeat-{j + 1}"
        run_dir.mkdir(parents=True, exist_ok=True)
        # Every run starts from a cold prefix cache, like the simulator (the probe, or the
        # previous run, left prompts in it).
        cold_prefix_cache(engine)
        steps_path = run_dir / "steps_real.csv"
        # A core in its own process: the replay takes the core's steps from the log (realrun.py).
        engine.set_step_log(StepLog(steps_path, record_schedule=engine.core_mode == "process"))
        echo(f"fidelity: {n_first} requests on the real engine in real time"
             + (f" (run {j + 1} of {opts.repeats})" if opts.repeats > 1 else "") + " ...")
        host = HostLoad()
        real: RealRun = run_real(engine, make(), sampler=sampler, sample_every_s=opts.sample_every_s,
                                 prefill_sampler=prefill_sampler)
        host_load = host.result()
        engine.step_log.close()
        probe_after = (speed_probe_parts(engine, rounds=PROBE_ROUNDS) if probe_before and not real.interrupted
                       else None)
        speed: dict[str, Any] = {"normalized": False, "probe_profile_s": prov.get("speed_probe_s"),
                                 "probe_before_s": probe_before.total if probe_before else None,
                                 "probe_after_s": probe_after.total if probe_after else None,
                                 "probe_before_parts": probe_before.to_dict() if probe_before else None,
                                 "probe_after_parts": probe_after.to_dict() if probe_after else None,
                                 "host_load": host_load}
        if probe_before is not None:
            speed.update(normalized=True, **speed_ratios(profile, [probe_before, probe_after]))
        if real.speed_samples:
            speed["sampled"] = {"samples": [[round(t, 6), round(sec, 9)] for t, sec in real.speed_samples],
                                "t0": real.t0, "every_s": opts.sample_every_s, "window_s": SMOOTH_S,
                                "sampler": sampler.kind}
            if real.prefill_samples:
                speed["sampled"].update(prefill_samples=[[round(t, 6), round(sec, 9)]
                                                         for t, sec in real.prefill_samples],
                                        prefill_sampler=prefill_sampler.kind)
        runs.append(_Run(run_dir, real, speed, read_step_log(steps_path) if real.step_starts else [], None))
        if real.interrupted:
            break
        probe_before = probe_after
    for r, sp in zip(runs, pool_speeds(profile, [r.speed for r in runs]), strict=True):
        r.speed = sp
    # Judged once the engine is done: simulating between two runs would put seconds of work
    # between the probe and the run it measures the machine for.
    echo("fidelity: simulating with the profile, and replaying the measured step times ...")
    sim_raw = simulate(raw_speed(profile), make, sched_cfg)
    for r in runs:
        r.replay = replay(r.real, make, sched_cfg).to_dict()
        r.judge(profile, make, sched_cfg, opts.speed_by_part, True, sim_raw, use_samples, opts.prefill_samples)
        write_requests(r.real.records, r.dir / "requests_real.csv")
        write_requests(r.sim.records, r.dir / "requests_sim.csv")
    first = runs[0]
    report: dict[str, Any] = dict(first.part)
    report["speed"] = first.speed
    report["num_requests"] = len(first.real.records)
    report["profile"] = str(opts.profile)
    report["interrupted"] = any(r.real.interrupted for r in runs)
    report["replay"] = first.replay
    if band_samples:
        report["band"] = prediction_band(first.judged, make, sched_cfg, first.real.records,
                                         StepNoise.for_run(first.judged, first.speed, first.rows,
                                                           first.step_speed),
                                         samples=band_samples, trace=first.trace)
    report["sensitivity"] = price_sensitivity(first.judged, make, sched_cfg, limits, trace=first.trace)
    report["real"] = {"num_steps": len(first.real.step_starts), "wall_s": first.real.wall_time,
                      "preemptions": first.real.num_preemptions,
                      "prefix_hit_tokens": sum(r.prefix_hit_tokens for r in first.real.records)}
    report["sim"] = {"num_steps": first.sim.num_steps, "preemptions": first.sim.num_preemptions,
                     "prefix_hit_tokens": sum(r.prefix_hit_tokens for r in first.sim.records)}
    report["workload"] = {k: v for k, v in dataclasses.asdict(opts).items() if k != "profile"}
    # Everything a later `fidelity --from-run` needs to simulate this workload again.
    report["scheduler_config"] = dataclasses.asdict(sched_cfg)
    report["engine"] = {"model": model, "engine_core_mode": engine.core_mode,
                        "max_model_len": engine.max_model_len, "vocab_size": engine.vocab_size,
                        "device": device.type, "dtype": str(engine.args.resolve_dtype(device)),
                        "hardware": hardware, "cpu": cpu,
                        "small_batch_rows": small_rows,
                        "max_num_seqs": sched_cfg.max_num_seqs,
                        "max_num_batched_tokens": sched_cfg.max_num_batched_tokens,
                        "enable_prefix_caching": sched_cfg.enable_prefix_caching,
                        "num_blocks": sched_cfg.num_blocks, "block_size": sched_cfg.block_size,
                        "policy": sched_cfg.policy}
    done = [r for r in runs if not r.real.interrupted]
    if len(done) > 1:
        report["repeats"] = repeat_summary(done, out)
    report["targets"] = verdict(report, limits)
    report["targets_speed_matched"] = verdict(report, limits, speed_matched=True)
    (out / "fidelity.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    speed = first.speed
    md = (table(report) + "\n\n" + target_line(report["targets"]) + speed_matched_line(report)
          + "\n\n" + sensitivity_line(report["sensitivity"]))
    if first.trace is not None:
        md = (sampled_line(speed) + "\n\n" + md + "\n\nwithout the speed scaling:\n\n"
              + table({"metrics": report["metrics_raw"], "throughput": report["throughput_raw"]}))
    elif speed["normalized"]:
        after = speed["probe_after_s"] or float("nan")
        by_part = (f" (decode {speed['machine_speed_ratio_decode']:.3f}, prefill "
                   f"{speed['machine_speed_ratio_prefill']:.3f}"
                   + ("; scaled by part)" if opts.speed_by_part else ")")
                   if "machine_speed_ratio_decode" in speed else "")
        pooled = (f"; every run is judged at the mean of the call's {speed['probes_pooled']} probes"
                  if speed.get("probes_pooled") else "")
        md = (f"machine speed during the run: {speed['machine_speed_ratio']:.3f} x the calibration's"
              f"{by_part} (speed probe {speed['probe_profile_s']:.3f} s at calibration, "
              f"{speed['probe_before_s']:.3f} s before and {after:.3f} s after this run{pooled}); simulated "
              "step times scaled by it\n\n" + md + "\n\nwithout the speed scaling:\n\n"
              + table({"metrics": report["metrics_raw"], "throughput": report["throughput_raw"]}))
    rp = first.replay
    md += (f"\n\nreplay mode: {'exact' if rp['exact'] else 'NOT exact'} "
           f"({rp['num_steps_real']} real steps, {rp['num_steps_sim']} replayed; "
           f"max token-time difference {rp['max_token_time_diff_s']:.2e} s)")
    if rp["first_mismatch"]:
        md += f"\nfirst mismatch: {rp['first_mismatch']}"
    md += step_line(report["steps"], "\n")
    if band_samples:
        md += "\n\n" + band_table(report["band"])
    if "repeats" in report:
        md += "\n\n" + repeat_table(report["repeats"])
    noisy = warning(first.speed["host_load"], "the real run")
    if noisy:
        md += "\n\n" + noisy
    (out / "fidelity.md").write_text(md + "\n")
    figure(first.real.records, first.sim.records, out / "fidelity.png",
           title=f"twinserve fidelity: {model}, profile {Path(str(opts.profile)).name}",
           other_real=[r.real.records for r in done[1:]])
    echo(md)
    return report


# What a run records of its speed samples; the rest of speed["sampled"] is its judgement's.
_SAMPLED_KEYS = ("samples", "t0", "every_s", "window_s", "sampler", "prefill_samples", "prefill_sampler")


@dataclass(slots=True)
class _Run:
    """One real replay of the workload (measured or recorded) and its prediction."""

    dir: Path
    real: Any                          # a RealRun, or a recorded run's RequestRecords
    speed: dict[str, Any]
    rows: list[dict[str, Any]]         # its step log
    replay: dict[str, Any] | None
    part: dict[str, Any] = dataclasses.field(default_factory=dict)
    judged: Any = None                 # the profile at the run's measured speed (x trace, with one)
    sim: Any = None
    sim_matched: Any = None            # the prediction at the run's own mean speed (speed_matched)
    trace: Any = None                  # the speed the run sampled (SpeedTrace), when judged by it
    step_speed: Any = None             # (start_s, prefill tokens, tokens) -> slowness along it

    @property
    def records(self) -> list[RequestRecord]:
        return self.real.records if isinstance(self.real, RealRun) else self.real

    def judge(self, profile: FittedCostModel, make: Callable[[], Workload], sched_cfg: Any,
              by_part: bool, normalize: bool, sim_raw: Any, use_samples: bool = True,
              prefill_samples: bool = False) -> None:
        """Simulate at the run's measured speed (sampled through it when it was and use_samples,
        else probed around it); compare that, and sim_raw (the prediction at the profile's own
        speed, the same for every run of a workload), with what it measured."""
        raw_profile = raw_speed(profile)
        self.judged, self.sim = raw_profile, sim_raw
        if self.speed.get("sampled"):  # what an earlier judgement derived goes (another profile's)
            self.speed["sampled"] = {k: v for k, v in self.speed["sampled"].items() if k in _SAMPLED_KEYS}
            # The samples' own time is the measurement's: out of the steps it is judged on (the
            # simulator pauses for the samples itself).
            s = self.speed["sampled"]
            if s.get("samples") and s.get("t0") is not None:
                self.rows = without_sample_pauses(self.rows, s["samples"] + (s.get("prefill_samples") or []),
                                                  t0=float(s["t0"]))
        trace = sampled_trace(profile, self.speed, prefill_samples) if normalize and use_samples else None
        if trace is not None:
            # Every simulated step priced at the speed sampled at its start.
            t0 = float(self.speed["sampled"]["t0"])
            self.trace, self.step_speed = trace, lambda start, pt, n: trace.at(start - t0, pt, n)
            rows = [r for r in self.rows if r.get("start_s") is not None]
            mean = trace.mean_factor([float(r["start_s"]) - t0 for r in rows],
                                     [float(r["step_time_s"]) for r in rows],
                                     [(float(r["num_prefill_tokens"]),
                                       float(r["num_prefill_tokens"]) + float(r["num_decode_seqs"])) for r in rows])
            self.speed["sampled"].update(trace.summary(), ref_s=profile.meta["provenance"]["speed_sample_s"],
                                         mean_factor=mean)
            self.sim = simulate(raw_profile, make, sched_cfg, trace)
        elif normalize and self.speed.get("normalized"):
            self.judged = scaled_profile(profile, self.speed, by_part)
            self.sim = simulate(self.judged, make, sched_cfg)
        part = compare(self.records, self.sim.records)
        raw = compare(self.records, sim_raw.records)
        part["metrics_raw"], part["throughput_raw"] = raw["metrics"], raw["throughput"]
        part["steps"] = step_errors(self.judged, self.rows, self.step_speed) if self.rows else {}
        part["steps_raw"] = step_errors(raw_profile, self.rows) if self.rows else {}
        # The error a machine holding one speed would leave: every step price scaled so the
        # run's own steps cost what they measured in sum (busy error 0). Not a prediction (it
        # reads the run's total); it splits the error into the machine's speed during the run,
        # which the probes around it can only estimate, and the profile's step shapes.
        busy = part["steps"].get("busy_err")
        if busy is not None and busy > -1:
            matched = dataclasses.replace(self.judged, time_scale=self.judged.time_scale / (1.0 + busy))
            self.sim_matched = simulate(matched, make, sched_cfg, self.trace)
            part["speed_matched"] = {"time_scale": matched.time_scale,
                                     "metrics": compare(self.records, self.sim_matched.records)["metrics"]}
        self.part = part


def raw_speed(profile: FittedCostModel) -> FittedCostModel:
    """The profile at the speed it was calibrated at (no machine-speed scaling)."""
    return dataclasses.replace(profile, time_scale=1.0, prefill_scale=1.0)


def _errs(metrics: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {m: {f"p{p}": metrics[m][f"p{p}"]["err"] for p in PERCENTILES} for m in metrics}


def tagged(records: list[RequestRecord], j: int) -> list[RequestRecord]:
    """The records of run j (from 0) with request ids made unique across runs, for pooling."""
    return [dataclasses.replace(r, request_id=f"run{j + 1}/{r.request_id}") for r in records]


def repeat_summary(runs: list[_Run], out: Path) -> dict[str, Any]:
    """Several real runs of one workload: each run's error, the error pooled over the runs (the
    requests of every run against their predictions, each at its run's speed), and each later
    run against the first, real against real: on a machine whose speed drifts, the floor."""
    pooled = compare([r for j, run in enumerate(runs) for r in tagged(run.records, j)],
                     [r for j, run in enumerate(runs) for r in tagged(run.sim.records, j)])
    per_run = [{"dir": str(run.dir.relative_to(out)) if run.dir != out else ".",
                "speed": run.speed, "replay": run.replay, "err": _errs(run.part["metrics"]),
                "throughput_err": run.part["throughput"]["output_tok_s"]["err"],
                "busy_err": run.part["steps"].get("busy_err"),
                "speed_matched_scale": (run.part.get("speed_matched") or {}).get("time_scale")} for run in runs]
    vs_first = []
    for run in runs[1:]:
        c = compare(runs[0].records, run.records)
        vs_first.append({"err": _errs(c["metrics"]),
                         "throughput_err": c["throughput"]["output_tok_s"]["err"],
                         "per_request_median_abs_err": {m: c["metrics"][m]["per_request_median_abs_err"]
                                                        for m in c["metrics"]}})
    floor = {m: {q: max(abs(v["err"][m][q]) for v in vs_first) for q in vs_first[0]["err"][m]}
             for m in vs_first[0]["err"]}
    out = {"count": len(runs), "runs": per_run, "pooled": {"metrics": pooled["metrics"]},
           "real_vs_first": vs_first, "real_spread": floor}
    if all(run.sim_matched is not None for run in runs):
        matched = compare([r for j, run in enumerate(runs) for r in tagged(run.records, j)],
                          [r for j, run in enumerate(runs) for r in tagged(run.sim_matched.records, j)])
        out["pooled_speed_matched"] = {"metrics": matched["metrics"]}
    return out


def repeat_table(rep: dict[str, Any]) -> str:
    """The markdown table of a repeated run: pooled and per-run errors beside real-vs-real."""
    n = rep["count"]
    head = (["metric", "pooled sim err"] + [f"run {j + 1} sim err" for j in range(n)]
            + [f"real run {j + 2} vs run 1" for j in range(n - 1)])
    lines = [f"the real engine ran the workload {n} times: the simulator against each run (at the run's "
             "measured speed) and against all of them pooled, beside the real runs against each other",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pooled = rep["pooled"]["metrics"]
    for m in METRICS:
        for q in (f"p{p}" for p in PERCENTILES):
            cells = [f"{m} {q}", f"{pooled[m][q]['err']:+.1%}"]
            cells += [f"{r['err'][m][q]:+.1%}" for r in rep["runs"]]
            cells += [f"{v['err'][m][q]:+.1%}" for v in rep["real_vs_first"]]
            lines.append("| " + " | ".join(cells) + " |")
    speeds = ", ".join(f"{r['speed'].get('machine_speed_ratio', float('nan')):.3f}" for r in rep["runs"])
    busy = ", ".join("n/a" if r["busy_err"] is None else f"{r['busy_err']:+.1%}" for r in rep["runs"])
    pooled_from = rep["runs"][0]["speed"].get("probes_pooled")
    if pooled_from:
        own = ", ".join(f"{r['speed']['adjacent'].get('machine_speed_ratio', float('nan')):.3f}"
                        for r in rep["runs"])
        speeds += f" (the mean of the call's {pooled_from} probes; each run's own two: {own})"
    sampled = [(r["speed"].get("sampled") or {}).get("mean_factor") for r in rep["runs"]]
    if all(x is not None for x in sampled):
        speeds += " by the probes; sampled during each run: " + ", ".join(f"{x:.3f}" for x in sampled)
    lines += ["", f"machine speed per run (x calibration's): {speeds}; busy-time error per run: {busy}"]
    return "\n".join(lines)


def write_requests(records: list[Any], path: Path) -> None:
    import pandas as pd

    rows = [{"request_id": r.request_id, "arrival_s": r.arrival_time, "prompt_tokens": r.num_prompt_tokens,
             "output_tokens": r.num_output_tokens, "first_token_s": r.first_token_time,
             "finish_s": r.finish_time, "prefix_hit_tokens": r.prefix_hit_tokens,
             "preemptions": r.num_preemptions, "finish_reason": r.finish_reason,
             "token_times": json.dumps(r.token_times)} for r in records]
    pd.DataFrame(rows).to_csv(path, index=False)


def read_requests(path: Path) -> list[RequestRecord]:
    """Records written by write_requests (token times only where the file has them)."""
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
            speed_by_part: bool = False, limits: dict[str, float] | None = None,
            speed_from: str | None = None, prefill_samples: bool | None = None) -> dict[str, Any]:
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
    # A run on another device or dtype than a CPU fp32 profile's was refused just above.
    check_profile_code_path(profile, recorded_small_batch_rows(eng), allow_profile_mismatch,
                            source=f"profile {profile_path}")
    check_profile_hardware(profile, eng.get("hardware"), eng.get("cpu"), allow_profile_mismatch,
                           source=f"profile {profile_path}")
    names = {f.name for f in dataclasses.fields(FidelityOptions)} - {"profile"}
    wl = {k: v for k, v in (old.get("workload") or {}).items() if k in names}
    if trace is not None:
        wl["trace"] = trace
    if speed_by_part:
        wl["speed_by_part"] = True
    if speed_from is not None:
        wl["speed_from"] = speed_from
    if prefill_samples is not None:
        wl["prefill_samples"] = prefill_samples
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
    normalize = opts.normalize_speed
    runs = [_recorded(run, speed_against(profile, old.get("speed") or {}), old.get("replay"))]
    runs += [_recorded(run / r["dir"], speed_against(profile, r["speed"]), r["replay"])
             for r in (old.get("repeats") or {}).get("runs", [])[1:]]
    for r, sp in zip(runs, pool_speeds(profile, [r.speed for r in runs]), strict=True):
        r.speed = sp
    sim_raw = simulate(raw_speed(profile), make, sched_cfg)
    for r in runs:
        r.judge(profile, make, sched_cfg, opts.speed_by_part, normalize, sim_raw,
                uses_samples(opts.speed_from, profile), opts.prefill_samples)
    first = runs[0]
    real, sim, speed = first.records, first.sim, first.speed
    ratio = speed.get("machine_speed_ratio") if normalize and speed.get("normalized") else None
    report: dict[str, Any] = dict(first.part)
    if band_samples:
        report["band"] = prediction_band(first.judged, make, sched_cfg, real,
                                         StepNoise.for_run(first.judged, speed if ratio else None,
                                                           first.rows, first.step_speed),
                                         samples=band_samples, trace=first.trace)
    report["sensitivity"] = price_sensitivity(first.judged, make, sched_cfg, limits, trace=first.trace)
    report.update(num_requests=len(real), profile=str(profile_path), rejudged_from=str(run),
                  speed={**speed, "from_recorded_run": True}, workload=wl, engine=eng,
                  scheduler_config=dataclasses.asdict(sched_cfg),
                  sim={"num_steps": sim.num_steps, "preemptions": sim.num_preemptions,
                       "prefix_hit_tokens": sum(r.prefix_hit_tokens for r in sim.records)},
                  real=old.get("real"), replay=old.get("replay"))
    if len(runs) > 1:
        report["repeats"] = repeat_summary(runs, run)
    report["targets"] = verdict(report, limits)
    report["targets_speed_matched"] = verdict(report, limits, speed_matched=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    scaling = (sampled_line(speed) if first.trace is not None
               else f"simulated step times scaled by the run's measured machine speed {ratio:.3f}"
               + (" (decode and prefill by part)" if opts.speed_by_part else "") if ratio else "")
    md = (f"recorded run {run} (real side as measured then) judged with profile {profile_path}"
          + (f"; {scaling}" if scaling else "")
          + "\n\n" + table(report) + "\n\n" + target_line(report["targets"]) + speed_matched_line(report)
          + "\n\n" + sensitivity_line(report["sensitivity"]))
    md += step_line(report["steps"], "\n\n")
    if band_samples:
        md += "\n\n" + band_table(report["band"])
    if "repeats" in report:
        md += "\n\n" + repeat_table(report["repeats"])
    (out / "fidelity.md").write_text(md + "\n")
    for j, r in enumerate(runs):
        sub = out if j == 0 else out / f"repeat-{j + 1}"
        sub.mkdir(parents=True, exist_ok=True)
        write_requests(r.sim.records, sub / "requests_sim.csv")
    figure(real, sim.records, out / "fidelity.png",
           title=f"twinserve fidelity (recorded run): {eng.get('model', '')}, profile {Path(str(profile_path)).name}",
           other_real=[r.records for r in runs[1:]])
    echo(md)
    return report


def speed_against(profile: FittedCostModel, speed: dict[str, Any]) -> dict[str, Any]:
    """A recorded run's speed measured against this profile's calibration probe.

    The ratios a run recorded are against the probe of the profile it was judged with then;
    judged with another profile (made at another time, on a machine in another state), its
    probes before and after are compared with that profile's probe instead. A profile that
    recorded no probe cannot be scaled: the run is then judged at the profile's own speed.
    """
    cal = profile.meta.get("provenance", {}).get("speed_probe_s")
    secs = [speed.get("probe_before_s"), speed.get("probe_after_s")]
    if not speed.get("normalized") or not any(secs):
        return speed
    out = {k: v for k, v in speed.items() if not k.startswith("machine_speed_ratio")}
    if not cal:
        return {**out, "normalized": False, "probe_profile_s": None}
    parts = [speed.get("probe_before_parts"), speed.get("probe_after_parts")]
    return {**out, "probe_profile_s": cal, **_probe_ratios(profile, secs, parts)}


def _probe_ratios(profile: FittedCostModel, secs: list[Any], parts: list[Any]) -> dict[str, float]:
    """speed_ratios of the probes that ran (seconds, parts as recorded), against the profile's."""
    got = [(float(sec), part) for sec, part in zip(secs, parts) if sec]
    if all(part for _, part in got):
        return speed_ratios(profile, [ProbeParts(**part) for _, part in got])
    # runs recorded before the probe's parts were
    return {"machine_speed_ratio": sum(sec for sec, _ in got) / len(got)
            / profile.meta.get("provenance", {})["speed_probe_s"]}


def pool_speeds(profile: FittedCostModel, speeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run of one call judged at the mean of all the call's speed probes.

    A probe times about half a minute of fixed steps, and this project's VM swings by tens of
    percent within a minute, so one probe before and one after a run estimate the run's mean
    speed poorly. On two studies of twelve runs each (Nov 30, 22:47 and Dec 1, 01:47) the
    probes around each run missed its own mean speed (what speed_matched measures) by 7.2% and
    9.0% rms, and the mean of the call's three probes by 6.5% and 7.0%; judged that way the
    targets met went from 13 to 16 and from 19 to 21 of 36. Each run keeps its own probes'
    ratios under "adjacent". A single run, or one without probes, is left as it is.
    """
    if len(speeds) < 2 or not all(s.get("normalized") for s in speeds):
        return speeds
    secs = [speeds[0].get("probe_before_s")] + [s.get("probe_after_s") for s in speeds]
    parts = [speeds[0].get("probe_before_parts")] + [s.get("probe_after_parts") for s in speeds]
    ratios = _probe_ratios(profile, secs, parts)
    out = []
    for sp in speeds:
        own = {k: v for k, v in sp.items() if k.startswith("machine_speed_ratio")}
        rest = {k: v for k, v in sp.items() if not k.startswith("machine_speed_ratio")}
        out.append({**rest, **ratios, "adjacent": own, "probes_pooled": sum(1 for x in secs if x)})
    return out


def _recorded(run_dir: Path, speed: dict[str, Any], replay_check: dict[str, Any] | None) -> _Run:
    steps = run_dir / "steps_real.csv"
    return _Run(run_dir, read_requests(run_dir / "requests_real.csv"), speed,
                read_step_log(steps) if steps.exists() else [], replay_check)


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot serialise {type(o).__name__}")


# Exit status of `twinserve fidelity --fail-on-miss` when a target cell is missed.
MISSED_TARGETS = 3


def exit_code(report: dict[str, Any], fail_on_miss: bool = False) -> int:
    """130 when the run was interrupted; MISSED_TARGETS when asked to fail on a missed target."""
    if report.get("interrupted"):
        return 130
    t = report.get("targets")
    return MISSED_TARGETS if fail_on_miss and t and t["met"] < t["of"] else 0


__all__ = ["CappedWorkload", "FidelityError", "FidelityOptions", "run_fidelity", "exit_code",
           "rejudge", "workload_factory"]
