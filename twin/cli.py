"""`twinserve calibrate` and `twinserve fidelity`: the subcommands of the twin's loop."""

from __future__ import annotations

import argparse
import sys

from twinserve.backends.real.serving.flags import add_model_arg
from twinserve.commands import add_engine_args, engine_args_from, subcommand


def _engine(ns: argparse.Namespace):
    """The real engine from the engine flags, with the asked-for torch thread count."""
    import torch

    from twinserve.backends.real.engine import LLMEngine

    torch.set_num_threads(ns.threads)
    return LLMEngine(engine_args_from(ns))


@subcommand("calibrate", "measure the real engine on designed steps and fit a simulator profile")
def _calibrate_parser(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--threads", type=int, default=1, help="torch threads (recorded in the profile)")
    p.add_argument("--repeats", type=int, default=1,
                   help="times the design is run (default 1: about 3 min for SmolLM2 on 1 thread)")
    p.add_argument("--quick", action="store_true", help="a small design (tests, tiny models)")
    p.add_argument("--probe-every", type=int, default=None, metavar="N",
                   help="speed probe every N design points (default 12; 0: before and after only)")
    p.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                   help="measure decodes and chunks at contexts up to this (default: the engine's max_model_len)")
    p.add_argument("--save-steps", default=None,
                   help="also write the calibration step log here (default: OUT with .steps.csv)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    add_engine_args(p)
    p.set_defaults(func=_calibrate, max_num_batched_tokens=2048)


def _calibrate(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from twinserve.core.errors import InvalidConfigError
    from twinserve.twin.calfit import calibrate
    from twinserve.twin.calibrate import CalibrationDesign

    out = Path(ns.out)
    # The design first: a bad flag is refused before an engine is loaded.
    design = CalibrationDesign.quick() if ns.quick else CalibrationDesign()
    design.repeats = ns.repeats
    if ns.max_context is not None and ns.max_context < 1:
        raise InvalidConfigError("max_context", ns.max_context, ">= 1")
    if ns.probe_every is not None:
        if ns.probe_every < 0:
            raise InvalidConfigError("probe_every", ns.probe_every, ">= 0 (0: only before and after)")
        design.probe_every = ns.probe_every
    engine = _engine(ns)
    try:
        profile, log = calibrate(engine, design, threads=ns.threads, progress=not ns.no_progress,
                                 max_context=ns.max_context)
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
    verify = fit.get("verify")
    if verify is not None:
        print(_verify_line(verify, profile))
    if profile.wake_extra_s:
        steps = ", ".join(f"{g:g} s: " + " / ".join(f"+{e * 1e3:.0f}" for e in row) + " ms"
                          for g, row in zip(profile.wake_idle_s, profile.wake_extra_s))
        print(f"  first steps after idling {steps}")
    from twinserve.twin.calibrate import drift_warning
    from twinserve.backends.real.hostload import warning

    prov = profile.meta.get("provenance", {})
    for noisy in (warning(prov.get("host_load"), "calibration"), drift_warning(prov)):
        if noisy:
            print(f"twinserve calibrate: {noisy}", file=sys.stderr)
    return 0


def _verify_line(v: dict, profile) -> str:
    """The verify term and its error on held-out verify steps, as calibrate prints it."""
    if not v.get("num_steps"):
        return ("  verify steps: none logged (the prompts found no n-gram drafts); verify steps are priced "
                "as prefill chunks")
    line = (f"  verify  {v['num_steps']:4d} steps: decode rows + {profile.per_verify_step_s * 1e3:.2f} ms per step "
            f"+ {profile.per_verify_seq_s * 1e3:.2f} ms per verify row + {profile.per_draft_token_s * 1e3:.2f} ms per "
            f"draft token, MAPE {v['in_sample']['mape']:.1%}, total "
            f"time {v['in_sample']['total_err']:+.1%} (priced as prefill chunks: {v['as_prefill']['total_err']:+.1%})")
    h = v.get("held_out")
    if h:
        line += (f"\n          held-out points, {h['num_steps']} steps: MAPE {h['mape']:.1%}, total time "
                 f"{h['total_err']:+.1%} (priced as prefill chunks: MAPE {h['as_prefill']['mape']:.1%}, total time "
                 f"{h['as_prefill']['total_err']:+.1%})")
    return line


def _pct(x: float | None) -> str:
    """A signed percentage, or n/a."""
    return "n/a" if x is None else f"{x:+.1%}"


@subcommand("fidelity", "forecast a workload with a profile, then serve it N times and judge the forecast")
def _fidelity_parser(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("--profile", default=None, help="profile JSON from `twinserve calibrate`, or builtin:NAME")
    p.add_argument("--calibrate", action="store_true", help="calibrate first, to --profile (default OUT/profile.json)")
    p.add_argument("--trace", default=None, help="trace CSV (Azure or num_prefill_tokens format)")
    p.add_argument("--config", default=None, help="a study TOML whose [workload] table is served")
    p.add_argument("--num-requests", type=int, default=40, help="requests per run")
    p.add_argument("--rate", type=float, default=None, help="Poisson arrivals (req/s); default: the trace's times")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace timestamps are multiplied by this")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="N closed-loop clients instead of arrival times, in the forecast and the runs alike "
                        "(as `twinserve bench --max-concurrency N` and [workload] concurrency)")
    p.add_argument("--think-time-s", type=float, default=0.0,
                   help="closed loop: seconds a client waits after a reply before its next request")
    p.add_argument("--warmup-requests", type=int, default=0,
                   help="closed loop: requests sent first, simulated and served but not judged")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="clip trace prompts")
    p.add_argument("--max-output-tokens", type=int, default=None, help="clip trace outputs")
    p.add_argument("--workload-seed", type=int, default=0, help="seed of arrivals and token ids")
    p.add_argument("--trace-offset", type=int, default=0, metavar="ROWS", help="skip the trace's first ROWS rows")
    p.add_argument("--out", required=True, help="folder for forecast.json, fidelity.json/.md, CSVs")
    p.add_argument("--repeats", type=int, default=3, help="real runs, all judged against the one forecast")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                   help="price the forecast at a speed probe taken before the runs (--no-probe: the profile's speed)")
    p.add_argument("--nowcast", action="store_true", help="also price each run at its own speed (never judged)")
    p.add_argument("--forecast-only", action="store_true", help="write forecast.json and stop (no real run)")
    p.add_argument("--allow-profile-mismatch", action="store_true", help="use a profile made for another "
                   "model, TP size, core mode, dtype or machine (the banner says so)")
    p.add_argument("--fail-on-fail", action="store_true", help="exit 3 when a cell's verdict is FAIL")
    p.add_argument("--acceptance-from", default=None, metavar="RUN/steps.csv",
                   help="with --speculative-config: the step log of an earlier, separate run whose acceptance "
                        "rates the forecast uses (never one of the judged runs)")
    add_engine_args(p)
    p.set_defaults(func=_fidelity)


def _fidelity(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from twinserve.backends.sim.fitted import FittedCostModel
    from twinserve.twin.fidelity import exit_code, run_fidelity
    from twinserve.twin.preflight import FidelityError, check_flags, check_profile, engine_facts
    from twinserve.twin.specforecast import spec_forecast
    from twinserve.twin.workload import FidelityOptions, check_workload, longest_request, workload_factory

    # Everything that can be refused is refused here, before any weights load.
    check_flags(ns.repeats, ns.rate, ns.num_requests, ns.time_scale, ns.trace_offset)
    if ns.profile is None and not ns.calibrate:
        raise FidelityError("give --profile P.json (from `twinserve calibrate --out P.json`) or --calibrate")
    profile_path = ns.profile or str(Path(ns.out) / "profile.json")
    opts = FidelityOptions(profile_path, ns.trace, ns.config, ns.num_requests, ns.rate, ns.time_scale,
                           ns.max_prompt_tokens, ns.max_output_tokens, ns.workload_seed, ns.trace_offset,
                           ns.allow_profile_mismatch, ns.repeats, ns.probe, ns.nowcast, ns.acceptance_from,
                           ns.max_concurrency, ns.think_time_s, ns.warmup_requests)
    args = engine_args_from(ns)
    spec_forecast(args.speculative_config, ns.acceptance_from, ns.out)
    facts = engine_facts(args)
    make_workload = workload_factory(opts, facts.max_model_len, facts.vocab_size)
    check_workload(make_workload, facts.max_model_len)
    if not ns.calibrate:
        profile = FittedCostModel.load(profile_path)
        check_profile(profile, facts, f"profile {profile_path}", ns.allow_profile_mismatch)
        made = profile.meta.get("provenance", {}).get("threads")
        if made is not None and made != ns.threads:
            print(f"twinserve fidelity: warning: the profile was calibrated with {made} threads, "
                  f"this run uses {ns.threads}", file=sys.stderr)
    engine = _engine(ns)
    try:
        if ns.calibrate:
            from twinserve.twin.calfit import calibrate

            # The profile covers the workload's longest request, not more (each context costs minutes).
            made, log = calibrate(engine, threads=ns.threads, progress=False,
                                  max_context=longest_request(make_workload))
            Path(profile_path).parent.mkdir(parents=True, exist_ok=True)
            made.save(profile_path)
            log.write(Path(profile_path).with_suffix(".steps.csv"))
            print(f"twinserve fidelity: calibrated {profile_path} (MAPE {made.meta['fit']['mape']:.1%})")
        report = run_fidelity(engine, opts, ns.out, forecast_only=ns.forecast_only)
    finally:
        engine.shutdown()
    if report.get("interrupted"):
        print("twinserve fidelity: interrupted; the runs completed were judged and written", file=sys.stderr)
    return exit_code(report, ns.fail_on_fail)
