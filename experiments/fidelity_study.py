"""The twin's error, measured: `twinserve fidelity` on both Azure traces at three loads.

For each trace the simulator (with the profile) first finds the engine's saturation
throughput on that trace's lengths; the real engine and the simulator then replay the
trace's lengths at Poisson rates of `--loads` x saturation (light, ~80%, past it). One
engine serves every run (warm, prefix cache reset between runs). Prints one table; with
`--repeats 2` or more the real engine replays every cell that many times, and a second table
sets the error pooled over the runs beside the real runs' own differences (run 2 against
run 1): on a machine whose speed drifts, the floor no prediction can beat.

    python experiments/fidelity_study.py --profile builtin:smollm2-135m-cpu-1t --out fidelity-study

`--calibrate` makes the profile first, on the study's own engine (`twinserve calibrate`'s design,
never the traces), and writes it to OUT/profile.json: on a shared machine whose speed moves
by tens of percent within the hour, a profile made minutes before the runs is the fair one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from twinserve.backends.real.config import EngineArgs
from twinserve.backends.real.engine import LLMEngine
from twinserve.backends.sim.fitted import FittedCostModel
from twinserve.twin.band import band_inside
from twinserve.twin.compare import DEFAULT_TARGETS, TARGET_METRICS, targets
from twinserve.twin.fidelity import FidelityOptions, run_fidelity, simulate, workload_factory

TRACES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}


def saturation(profile: FittedCostModel, opts: FidelityOptions, engine: LLMEngine) -> float:
    """Requests per second the simulated engine completes when every request is queued at once."""
    flood = dataclasses.replace(opts, rate=1000.0)
    make = workload_factory(flood, engine.max_model_len, engine.vocab_size)
    res = simulate(profile, make, engine.scheduler_config)
    done = [r for r in res.records if r.finish_time is not None]
    return len(done) / max(r.finish_time for r in done)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default=None, help="profile JSON or builtin:NAME (or --calibrate)")
    p.add_argument("--calibrate", action="store_true",
                   help="calibrate on this engine first (design repeated --calibrate-repeats times) and "
                        "use that profile; written to OUT/profile.json")
    p.add_argument("--calibrate-repeats", type=int, default=1)
    p.add_argument("--calibrate-probe-every", type=int, default=None, metavar="N",
                   help="speed probe every N design points while calibrating (calibrate --probe-every)")
    p.add_argument("--calibrate-max-context", type=int, default=None, metavar="TOKENS",
                   help="calibrate decodes and chunks up to this context too (calibrate --max-context; "
                        "e.g. the longest prompt + output the study runs)")
    p.add_argument("--out", default="fidelity-study")
    p.add_argument("--traces-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "traces"))
    p.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    p.add_argument("--loads", nargs="+", type=float, default=[0.3, 0.8, 1.3])
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--repeats", type=int, default=1, help="real runs per cell (fidelity --repeats)")
    p.add_argument("--speed-from", choices=["auto", "probes", "samples"], default="auto",
                   help="what each run's machine speed is read from (fidelity --speed-from)")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="smollm2", help="HF folder, .gguf file or short name")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="worker processes (one --threads each); the profile must be made at the same size")
    p.add_argument("--engine-core-mode", default="inproc", choices=["inproc", "process"],
                   help="the engine core in this process or its own; the profile must be made in the same")
    a = p.parse_args()
    if (a.profile is None) == (not a.calibrate):
        p.error("give --profile or --calibrate (one of them)")
    torch.set_num_threads(a.threads)
    engine = LLMEngine(EngineArgs(model=a.model, device=a.device, dtype=a.dtype,
                                  tensor_parallel_size=a.tensor_parallel_size,
                                  engine_core_mode=a.engine_core_mode,
                                  max_num_seqs=a.max_num_seqs,
                                  max_num_batched_tokens=a.max_num_batched_tokens))
    out = Path(a.out)
    if a.calibrate:
        from twinserve.twin.calibrate import CalibrationDesign, calibrate

        t = time.time()
        design = CalibrationDesign(repeats=a.calibrate_repeats)
        if a.calibrate_max_context is not None:
            design = design.reaching(a.calibrate_max_context)
        if a.calibrate_probe_every is not None:
            design.probe_every = a.calibrate_probe_every
        made, log = calibrate(engine, design, threads=a.threads, progress=False)
        out.mkdir(parents=True, exist_ok=True)
        a.profile = str(out / "profile.json")
        made.save(a.profile)
        log.write(out / "profile.steps.csv")
        fit = made.meta["fit"]
        print(f"calibrated in {time.time() - t:.0f} s: {fit['num_steps']} steps, R2 {fit['r2']:.4f}, "
              f"MAPE {fit['mape']:.1%}; wrote {a.profile}", flush=True)
        from twinserve.twin.calibrate import drift_warning

        moved = drift_warning(made.meta.get("provenance", {}))
        if moved:
            print(moved, flush=True)
    profile = FittedCostModel.load(a.profile)
    rows = []
    print(f"threads={torch.get_num_threads()} profile={a.profile} engine_core_mode={engine.core_mode} "
          f"engine: max_num_seqs={a.max_num_seqs} "
          f"max_num_batched_tokens={a.max_num_batched_tokens} prefix caching on, "
          f"{engine.scheduler_config.num_blocks} KV blocks", flush=True)
    for name in a.traces:
        trace = str(Path(a.traces_dir) / TRACES[name])
        base = FidelityOptions(a.profile, trace=trace, num_requests=a.num_requests, rate=1.0,
                               max_prompt_tokens=a.max_prompt_tokens, max_output_tokens=a.max_output_tokens,
                               speed_from=a.speed_from)
        mu = saturation(profile, base, engine)
        print(f"{name}: simulated saturation {mu:.3f} req/s", flush=True)
        for i, load in enumerate(a.loads):
            opts = dataclasses.replace(base, rate=round(load * mu, 4), seed=i, repeats=a.repeats)
            t = time.time()
            rep = run_fidelity(engine, opts, out / f"{name}-{load:g}", echo=lambda s: None)
            m = rep["metrics"]
            row = {"trace": name, "load": load, "rate": opts.rate, "wall_s": round(time.time() - t),
                   **{f"{k}_{q}": m[k][q]["err"] for k in ("ttft", "tpot", "e2e") for q in ("p50", "p99")},
                   "throughput": rep["throughput"]["output_tok_s"]["err"],
                   "step_median": rep["steps"].get("median_err"), "busy": rep["steps"].get("busy_err"),
                   "replay_exact": rep["replay"]["exact"],
                   # The noise floor: the band's half-width at E2E p50, and how many cells hold the
                   # real value (band.py).
                   "e2e_p50_band": rep["band"]["cells"]["e2e"]["p50"]["half_width"],
                   "band_inside": "{}/{}".format(*band_inside(rep["band"])),
                   # The share of the run's busy time in steps larger than any the profile was
                   # fitted on (None: the profile does not record its range).
                   "beyond_fit": (rep["steps"].get("beyond_range") or {}).get("busy_share"),
                   # TTFT/TPOT/E2E within 5% at p50 and 10% at p99 (pooled over the runs with
                   # --repeats), and how many lie within the real runs' own spread.
                   "targets": "{met}/{of}".format(**rep["targets"]),
                   "within_spread": rep["targets"].get("within_real_spread"),
                   # The same targets with each run at its own mean speed (fidelity.py's
                   # speed_matched: not a prediction, the step shapes' share of the error).
                   "targets_own_speed": ("{met}/{of}".format(**rep["targets_speed_matched"])
                                         if rep.get("targets_speed_matched") else None),
                   # The busiest share of the machine's other CPUs during a real run (hostload.py):
                   # work there shares the memory bus and cache with the engine's core.
                   "neighbours": _busiest_neighbours(rep),
                   # The error in the run's mean speed that alone would use up the tightest target
                   # (fidelity.price_sensitivity): what the speed probes must know to meet them all.
                   "speed_precision": (rep["sensitivity"]["tightest"] or {}).get("speed_precision"),
                   # What the machine's speed during the runs was read from (fidelity --speed-from).
                   "speed_from": "samples" if (rep["speed"].get("sampled") or {}).get("mean_factor")
                   else "probes"}
            if "repeats" in rep:
                r = rep["repeats"]
                pooled = r["pooled"]["metrics"]
                row.update({f"pooled_{k}_{q}": pooled[k][q]["err"] for k in ("ttft", "tpot", "e2e")
                            for q in ("p50", "p99")})
                row.update({f"real2_{k}_{q}": r["real_vs_first"][0]["err"][k][q]
                            for k in ("ttft", "tpot", "e2e") for q in ("p50", "p99")})
                row["speeds"] = [x["speed"].get("machine_speed_ratio") for x in r["runs"]]
                # The mean speed each run sampled through itself (speedtrace.py), when judged by it.
                row["sampled"] = [(x["speed"].get("sampled") or {}).get("mean_factor") for x in r["runs"]]
                row["busy_runs"] = [x["busy_err"] for x in r["runs"]]
                # Target cells per real run: the simulator against each, and real run 2 as if it
                # were a prediction of run 1 (what the engine repeats itself to).
                row["sim_met_runs"] = [cells_met(x["err"]) for x in r["runs"]]
                row["real2_met"] = cells_met(r["real_vs_first"][0]["err"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    engine.shutdown()
    out.mkdir(parents=True, exist_ok=True)
    table = summary_table(rows, a.repeats)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    return 0


def cells_met(err: dict[str, dict[str, float]]) -> int:
    """How many target cells a {metric: {pXX: signed error}} map meets (compare.targets)."""
    return targets({m: {q: {"err": e} for q, e in per.items()} for m, per in err.items()})["met"]


def summary_table(rows: list[dict], repeats: int = 1) -> str:
    """summary.md: a row per run, with --repeats a second table of the pooled errors beside
    real run 2 against run 1, and the closing counts (met_summary)."""
    n_cells = len(TARGET_METRICS) * len(DEFAULT_TARGETS)
    cols = ["ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "throughput"]
    lines = ["| trace | load | rate (req/s) | " + " | ".join(c.replace("_", " ") for c in cols)
             + " | step median | busy time | replay exact | E2E p50 band ± | real inside band | busy beyond fit "
             "| targets met | within real spread | met at the run's own speed | speed known within "
             "| other CPUs busy | speed from |",
             "|" + "---|" * (len(cols) + 15)]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['load']:g} | {r['rate']:.3f} | "
                     + " | ".join(f"{r[c]:+.1%}" for c in cols)
                     + f" | {r['step_median']:+.1%} "
                     f"| {'n/a' if r['busy'] is None else format(r['busy'], '+.1%')} "
                     f"| {'yes' if r['replay_exact'] else 'NO'} "
                     f"| {r['e2e_p50_band']:.1%} | {r['band_inside']} "
                     f"| {'n/a' if r['beyond_fit'] is None else format(r['beyond_fit'], '.0%')} "
                     f"| {r['targets']} | {'n/a' if r['within_spread'] is None else r['within_spread']} "
                     f"| {r['targets_own_speed'] or 'n/a'} "
                     f"| {'n/a' if r['speed_precision'] is None else format(r['speed_precision'], '.1%')} "
                     f"| {'n/a' if r['neighbours'] is None else format(r['neighbours'], '.0%')} "
                     f"| {r['speed_from']} |")
    if repeats > 1:
        lines += ["", f"{repeats} real runs per cell: the simulator against all of them pooled, and real "
                  "run 2 against real run 1", "",
                  "| trace | load | " + " | ".join(f"pooled {c.replace('_', ' ')}" for c in cols[:6])
                  + " | " + " | ".join(f"real 2 vs 1 {c.replace('_', ' ')}" for c in cols[:6])
                  + " | speed per run (probes) | sampled | busy err per run | sim met per run | real 2 vs 1 met |",
                  "|" + "---|" * 19]
        for r in (r for r in rows if "speeds" in r):  # a run cut short has no repeats
            lines.append(f"| {r['trace']} | {r['load']:g} | "
                         + " | ".join(f"{r['pooled_' + c]:+.1%}" for c in cols[:6]) + " | "
                         + " | ".join(f"{r['real2_' + c]:+.1%}" for c in cols[:6]) + " | "
                         + ", ".join(f"{x:.3f}" if x else "n/a" for x in r["speeds"]) + " | "
                         + ", ".join(f"{x:.3f}" if x else "n/a" for x in r["sampled"]) + " | "
                         + ", ".join("n/a" if x is None else f"{x:+.1%}" for x in r["busy_runs"]) + " | "
                         + ", ".join(f"{x}/{n_cells}" for x in r["sim_met_runs"]) + f" | {r['real2_met']}/{n_cells} |")
    lines += ["", met_summary(rows)]
    repeated = [r for r in rows if "real2_met" in r]
    if repeated:
        lines.append(repeats_summary(repeated))
    return "\n".join(lines)


def repeats_summary(rows: list[dict]) -> str:
    """With --repeats: the cells the simulator met against each real run, and those that real
    run 2 meets as a prediction of run 1, over the study."""
    n_cells = len(TARGET_METRICS) * len(DEFAULT_TARGETS)
    per_run = [sum(x) for x in zip(*(r["sim_met_runs"] for r in rows))]
    return (f"per real run, the simulator met {', '.join(str(x) for x in per_run)} of {n_cells * len(rows)} cells; "
            f"real run 2 as a prediction of run 1 met {sum(r['real2_met'] for r in rows)} of {n_cells * len(rows)}")


def met_summary(rows: list[dict]) -> str:
    """The target cells met over the study, below saturation (load < 1) and at or past it, at
    the predicted speed and at each run's own. Past saturation a step-price error is amplified
    many times over (each report's sensitivity line), so the two halves are told apart."""
    def count(key: str, sel: list[dict]) -> tuple[int, int]:
        got = [tuple(map(int, r[key].split("/"))) for r in sel if r.get(key)]
        return sum(m for m, _ in got), sum(n for _, n in got)

    below = [r for r in rows if r["load"] < 1]
    past = [r for r in rows if r["load"] >= 1]
    parts = ["targets met: {} of {} cells".format(*count("targets", rows))]
    if below and past:
        parts[0] += " (below saturation {} of {}, at or past it {} of {})".format(
            *count("targets", below), *count("targets", past))
    own = count("targets_own_speed", rows)
    if own[1]:
        parts.append("at each run's own speed {} of {}".format(*own))
    parts.append(f"replay exact in {sum(1 for r in rows if r['replay_exact'])} of {len(rows)} runs")
    return "; ".join(parts)


def _busiest_neighbours(rep: dict) -> float | None:
    """The largest neighbour_share over a cell's real runs (None: none recorded it)."""
    runs = rep["repeats"]["runs"] if "repeats" in rep else [rep]
    got = [(x["speed"].get("host_load") or {}).get("neighbour_share") for x in runs]
    got = [g for g in got if g is not None]
    return max(got) if got else None


if __name__ == "__main__":
    sys.exit(main())
