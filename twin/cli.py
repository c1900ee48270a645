"""`twinserve calibrate` and `twinserve fidelity`: the subcommands of the twin's loop."""

from __future__ import annotations

import argparse
import sys

from twinserve.commands import add_engine_args, engine_args_from, subcommand


def _engine(ns: argparse.Namespace):
    """The real engine from the engine flags, with the asked-for torch thread count."""
    import torch

    from twinserve.backends.real.engine import LLMEngine

    torch.set_num_threads(ns.threads)
    return LLMEngine(engine_args_from(ns, ns.model))


@subcommand("calibrate", "measure the real engine on designed steps and fit a simulator profile")
def _calibrate_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="HF folder, .gguf file or short name")
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--threads", type=int, default=1, help="torch threads (recorded in the profile)")
    p.add_argument("--repeats", type=int, default=1,
                   help="times the design is run (default 1: about 3 min for SmolLM2 on 1 thread)")
    p.add_argument("--quick", action="store_true", help="a small design (tests, tiny models)")
    p.add_argument("--probe-every", type=int, default=None, metavar="N",
                   help="run the speed probe every N design points (0: only before and after; default "
                        "12 where the probes correct the drift, 0 where the speed samples do): denser probes "
                        "follow a machine whose speed swings within minutes more closely, at ~10 s each")
    p.add_argument("--sample-every", type=float, default=None, metavar="SECONDS",
                   help="sample the machine's speed after a step every this many seconds "
                        "(default 2; 0: never): the steps are corrected to the median sample's speed, which "
                        "fidelity's samples are measured against (a CPU engine in this process only)")
    p.add_argument("--speed-sampler", choices=("weights", "matvec"), default=None,
                   help="what samples it: a one-row pass through the model's own weights and LM head "
                        "(default; about 33 ms for SmolLM2) or a 3 ms product over a fixed 64 MiB matrix; "
                        "fidelity samples with the profile's kind")
    p.add_argument("--prefill-samples", action="store_true",
                   help="also sample with a prefill sampler (128 rows through the first two layers' "
                        "projections, about 14 ms for SmolLM2) after each speed sample, and correct the steps' "
                        "prefill shares by its speed (off by default: on Dec 2 it tracked served steps worse)")
    p.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                   help="also measure decodes and prefill chunks at up to this many tokens of "
                        "context (the longest prompt + output the profile will price; longer "
                        "calibration; the default design reaches ~390 tokens per decode)")
    p.add_argument("--from-log", default=None,
                   help="fit a step log written by the engine (--step-log-path) instead of running")
    p.add_argument("--refit", default=None, metavar="PROFILE",
                   help="fit a calibrated profile again from the step log it was made from (its "
                        ".steps.csv, or --from-log), keeping its provenance: no engine, no device")
    p.add_argument("--merge", nargs="+", default=None, metavar="PROFILE",
                   help="fit one profile on the step logs of several calibrations of one engine (each "
                        "corrected as --refit corrects it, scaled to their median reference speed): "
                        "calibrations made at different times average out the machine's mood")
    p.add_argument("--save-steps", default=None,
                   help="also write the calibration step log here (default: OUT with .steps.csv)")
    p.add_argument("--no-progress", action="store_true")
    add_engine_args(p)
    p.set_defaults(func=_calibrate, max_num_batched_tokens=2048)


def _calibrate(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from twinserve.backends.real.step_log import read_step_log
    from twinserve.backends.sim.fit import fit_step_profile

    out = Path(ns.out)
    if ns.merge and (ns.refit or ns.from_log):
        from twinserve.core.errors import InvalidConfigError

        raise InvalidConfigError("merge", ns.merge, "on its own (each profile's step log sits beside it), "
                                 "not with --refit or --from-log")
    if ns.merge:
        from twinserve.twin.calibrate import merge

        profile = merge(ns.merge)
    elif ns.refit:
        from twinserve.twin.calibrate import refit

        profile = refit(ns.refit, ns.from_log)
    elif ns.from_log:
        profile = fit_step_profile(read_step_log(ns.from_log), model=_model_name(ns.model),
                                   provenance={"made_by": "twinserve calibrate --from-log",
                                               "step_log": str(ns.from_log)})
    else:
        from twinserve.twin.calibrate import CalibrationDesign, calibrate

        from twinserve.core.errors import InvalidConfigError

        # The design first: a bad flag is refused before an engine is loaded.
        design = CalibrationDesign.quick() if ns.quick else CalibrationDesign()
        design.repeats = ns.repeats
        if ns.max_context is not None:
            design = design.reaching(ns.max_context)
        if ns.probe_every is not None:
            if ns.probe_every < 0:
                raise InvalidConfigError("probe_every", ns.probe_every, ">= 0 (0: only before and after)")
            design.probe_every = ns.probe_every
        if ns.sample_every is not None:
            if not ns.sample_every >= 0:
                raise InvalidConfigError("sample_every", ns.sample_every, ">= 0 seconds (0: never)")
            design.sample_every_s = ns.sample_every
        if ns.speed_sampler is not None:
            design.sampler = ns.speed_sampler
        design.prefill_samples = ns.prefill_samples
        engine = _engine(ns)
        try:
            profile, log = calibrate(engine, design, threads=ns.threads, progress=not ns.no_progress)
        finally:
            engine.shutdown()
        log.write(ns.save_steps or out.with_suffix(".steps.csv"))
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(out)
    fit = profile.meta["fit"]
    print(f"wrote {out}: {fit['num_steps']} steps, R2 {fit['r2']:.4f}, MAPE {fit['mape']:.1%}, "
          f"p95 abs error {fit['p95_abs_rel_err']:.1%}, total time {_pct(fit.get('total_err'))}")
    for kind, d in fit["by_kind"].items():
        print(f"  {kind:8s} {d['num_steps']:4d} steps, MAPE {d['mape']:.1%}, worst "
              f"{d['worst_rel_err']:+.1%}, total time {_pct(d.get('total_err'))}, "
              f"mean step {d['mean_step_s'] * 1e3:.1f} ms")
    if "overhead_share" in fit:
        print(f"  engine CPU overhead: {fit['overhead_share']:.1%} of step time on average")
    if fit.get("comm_share"):
        print(f"  tensor-parallel all-reduce: {fit['comm_share']:.1%} of step time")
    top = profile.shape_range
    if top:
        print(f"  fitted steps of up to {top['num_tokens']:.0f} new tokens, {top['num_prefill_seqs']:.0f} prefills, "
              f"{top['prefill_context']:.0f} cached prompt tokens, {top['num_decode_seqs']:.0f} decodes, "
              f"{top['decode_context_per_seq']:.0f} tokens of context per decode; beyond, the model extrapolates")
    if profile.wake_extra_s:
        steps = ", ".join(f"{g:g} s: " + " / ".join(f"+{e * 1e3:.0f}" for e in row) + " ms"
                          for g, row in zip(profile.wake_idle_s, profile.wake_extra_s))
        print(f"  first steps after idling {steps}")
    from twinserve.twin.calibrate import drift_warning
    from twinserve.twin.hostload import warning

    prov = profile.meta.get("provenance", {})
    samples, dropped = prov.get("speed_samples") or [], prov.get("speed_samples_dropped") or []
    if prov.get("drift_source") == "samples" and samples:
        at = ", ".join(f"{samples[i][0]:.0f} s" for i in dropped[:8]) + (", ..." if len(dropped) > 8 else "")
        print(f"  speed samples: {len(samples)}, smoothed by their {prov.get('speed_sample_smoothing', 'mean')} "
              f"over {prov.get('speed_sample_window_s', 0):g} s; "
              + (f"{len(dropped)} left out, contradicted by the steps around them (at {at})" if dropped
                 else "none contradicted by the steps around them"))
    pre = prov.get("prefill_speed_samples") or []
    if prov.get("prefill_speed_sample_s") and pre:
        secs = sorted(sec for _, sec in pre)
        print(f"  prefill samples ({prov.get('prefill_speed_sampler')}): {len(pre)}, reference "
              f"{prov['prefill_speed_sample_s'] * 1e3:.2f} ms (x {secs[0] / prov['prefill_speed_sample_s']:.2f} to "
              f"x {secs[-1] / prov['prefill_speed_sample_s']:.2f}); the steps' prefill shares corrected by them")
    for noisy in (warning(prov.get("host_load"), "calibration"), drift_warning(prov)):
        if noisy:
            print(f"twinserve calibrate: {noisy}", file=sys.stderr)
    return 0


def _pct(x: float | None) -> str:
    """A signed percentage, or n/a."""
    return "n/a" if x is None else f"{x:+.1%}"


def _model_name(model: str) -> str:
    """The catalog name of a model given by path or short name (its config only is read)."""
    from twinserve.backends.real.engine import _peek_config
    from twinserve.backends.real.models.registry import resolve_model
    from twinserve.twin.calibrate import catalog_name

    source = resolve_model(model)
    return catalog_name(_peek_config(source), source.name)


@subcommand("fidelity", "replay one workload on the real engine and in the simulator; report the error")
def _fidelity_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="HF folder, .gguf file or short name")
    p.add_argument("--profile", required=True, help="profile JSON from `twinserve calibrate`, "
                   "or builtin:NAME")
    p.add_argument("--trace", default=None, help="trace CSV (Azure or num_prefill_tokens format)")
    p.add_argument("--config", default=None, help="a study TOML whose [workload] table is replayed")
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals at this rate (req/s); default: the trace's timestamps")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="trace timestamps are multiplied by this")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="clip trace prompts")
    p.add_argument("--max-output-tokens", type=int, default=None, help="clip trace outputs")
    p.add_argument("--workload-seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for fidelity.json, .md, .png, CSVs")
    p.add_argument("--repeats", type=int, default=1,
                   help="replay the workload this many times on the real engine, back to back, each "
                        "run judged at its own measured speed; the report adds the error pooled over "
                        "the runs and the real runs against each other (the machine's own floor)")
    p.add_argument("--from-run", default=None, metavar="DIR",
                   help="judge the profile against a real run recorded earlier (a folder this command "
                        "wrote; --trace re-points its trace): the simulator only, no engine")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--band-samples", type=int, default=20,
                   help="noisy simulations behind the prediction band (0: none): step noise with the "
                        "spread and correlation of the run's own steps (the calibration's residuals "
                        "without a step log), run speed noise from the probes")
    p.add_argument("--allow-profile-mismatch", action="store_true",
                   help="use a profile calibrated for another model, tensor-parallel size, engine-core mode, "
                        "dtype or machine")
    p.add_argument("--normalize-speed", action=argparse.BooleanOptionalAction, default=True,
                   help="scale simulated step times by the machine's speed during the run against "
                   "calibration's (sampled through it, or probed around it: --speed-from); raw errors "
                   "are reported too")
    p.add_argument("--speed-from", choices=("auto", "samples", "probes"), default=None,
                   help="samples: the machine's speed sampled every 2 s all through the run, each simulated "
                        "step priced at the speed at its start, where the profile has a reference sample and "
                        "the engine runs its steps in this process on a CPU; probes: a probe before and after "
                        "the run; auto (the default): samples when the profile's reference was taken by the "
                        "weights sampler (calibrate's default), else probes (with --from-run: as the run was "
                        "judged)")
    p.add_argument("--sample-every", type=float, default=None, metavar="SECONDS",
                   help="seconds between two samples when the run is sampled (default 2)")
    p.add_argument("--prefill-samples", action=argparse.BooleanOptionalAction, default=None,
                   help="where the profile has a prefill sampler's reference (calibrate --prefill-samples), "
                        "also sample with it and price each step's prefill share at its speed; the default "
                        "prices whole steps at the weights samples' speed (with --from-run: as the run was "
                        "judged)")
    p.add_argument("--speed-by-part", action="store_true",
                   help="scale decode and each step's prefill share by their own probe parts' drift "
                        "instead of the whole probe's")
    p.add_argument("--target-p50", type=float, default=0.05,
                   help="the largest |relative error| at p50 of TTFT, TPOT and E2E that meets the target")
    p.add_argument("--target-p99", type=float, default=0.10, help="the same at p99")
    p.add_argument("--fail-on-miss", action="store_true",
                   help="exit 3 when a target is missed (pooled over the runs with --repeats)")
    add_engine_args(p)
    p.set_defaults(func=_fidelity)


def _fidelity(ns: argparse.Namespace) -> int:
    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.twin.fidelity import FidelityError, FidelityOptions, exit_code, run_fidelity
    from twinserve.twin.speedtrace import SAMPLE_EVERY_S

    if ns.band_samples < 0 or ns.band_samples == 1:
        raise FidelityError(f"--band-samples {ns.band_samples}: give 0 (no band) or at least 2")
    if ns.repeats < 1:
        raise FidelityError(f"--repeats {ns.repeats}: give 1 or more")
    for flag, v in (("--target-p50", ns.target_p50), ("--target-p99", ns.target_p99)):
        if not 0 < v < 10:
            raise FidelityError(f"{flag} {v}: give the largest relative error allowed, a fraction "
                                "such as 0.05 (5%)")
    limits = {"p50": ns.target_p50, "p99": ns.target_p99}
    if ns.from_run:
        from twinserve.twin.fidelity import rejudge

        report = rejudge(ns.from_run, ns.profile, ns.out, trace=ns.trace, model=ns.model,
                         allow_profile_mismatch=ns.allow_profile_mismatch, band_samples=ns.band_samples,
                         speed_by_part=ns.speed_by_part, limits=limits, speed_from=ns.speed_from,
                         prefill_samples=ns.prefill_samples)
        return exit_code(report, ns.fail_on_miss)
    opts = FidelityOptions(ns.profile, ns.trace, ns.config, ns.num_requests, ns.rate, ns.time_scale,
                           ns.max_prompt_tokens, ns.max_output_tokens, ns.workload_seed,
                           ns.allow_profile_mismatch, ns.normalize_speed, ns.speed_by_part, ns.repeats,
                           ns.speed_from or "auto",
                           ns.sample_every if ns.sample_every is not None else SAMPLE_EVERY_S,
                           bool(ns.prefill_samples))
    profile = FittedCostModel.load(ns.profile)
    made = profile.meta.get("provenance", {}).get("threads")
    if made is not None and made != ns.threads:
        print(f"twinserve fidelity: warning: the profile was calibrated with {made} threads, "
              f"this run uses {ns.threads}", file=sys.stderr)
    engine = _engine(ns)
    try:
        # run_fidelity refuses a wrong profile or an unservable trace before the real run starts.
        report = run_fidelity(engine, opts, ns.out, band_samples=ns.band_samples, limits=limits)
    finally:
        engine.shutdown()
    if report.get("interrupted"):
        print("twinserve fidelity: interrupted; wrote what was measured", file=sys.stderr)
    return exit_code(report, ns.fail_on_miss)
