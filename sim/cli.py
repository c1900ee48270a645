"""The `simulate` console script: a default study, single runs from TOML, and parameter sweeps.

    simulate                                   # the embedded default study -> ./simulate-out/
    simulate run --config study.toml [--set field=value ...] [--out DIR]
    simulate sweep [--config study.toml] --grid field=a,b,c [--grid ...] [--workers N]
    simulate search [--config study.toml] --slo ttft_p99=2 --slo tpot_p99=0.1 [--grid ...]
             [--target-rate R] [--tolerance 0.02]
    simulate validate --silicon [--backend B] [--system S] [--model M] [--cost-model roofline|aic]
             [--rows dev|heldout|all] [--limit N]   # the measured rows of aiconfigurator-core
    sweep, search and validate take --ray [ADDRESS]: run points as Ray tasks on a cluster (or a local one)

Any field of the study config may be set or swept, by 'section.field' or by its bare
name when unique (e.g. max_num_batched_tokens, rate, enable_prefix_caching, hardware).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from twinserve.core.errors import TwinserveError

from twinserve.sim.clients import closed_loop_line
from twinserve.sim.config import StudyConfig, load_config, replica_config, set_field, validate
from twinserve.sim.errors import ConfigError
from twinserve.sim.runner import LOCAL_RAY, PointError, PointFailure, workers_arg
from twinserve.sim.study import parse_grid, run_grid, run_point

DEFAULT_GRID = {"scheduler.max_num_batched_tokens": ["512", "2048", "8192"],
                "workload.rate": ["1", "2", "3", "4", "5", "6"]}


def default_study() -> StudyConfig:
    """Llama-2-7B on one A100-80GB, lengths from the bundled Azure conversation excerpt."""
    cfg = StudyConfig()
    cfg.engine.model = "Llama-2-7B"
    cfg.engine.hardware = "A100-80GB"
    w = cfg.workload
    w.trace = "builtin:azure_conv"
    w.prompt_dist = w.output_dist = "trace"
    w.arrival = "poisson"
    w.num_requests = 600
    cfg.run.name = "default study: chunked-prefill budget x request rate"
    return cfg


def _base(args: argparse.Namespace) -> StudyConfig:
    cfg = load_config(args.config) if getattr(args, "config", None) else (
        default_study() if args.command is None else StudyConfig())
    for item in getattr(args, "set", None) or []:
        if "=" not in item:
            raise ConfigError(item, "--set takes field=value")
        name, value = item.split("=", 1)
        set_field(cfg, name.strip(), value.strip(), "--set")
    for flag, field in (("seed", "run.seed"), ("requests", "workload.num_requests")):
        value = getattr(args, flag, None)
        if value is not None:
            set_field(cfg, field, value, f"--{flag}")
    if getattr(args, "no_fast_forward", False):
        cfg.run.fast_forward = False
    validate(cfg)
    return cfg


def _layout(e: Any) -> str:
    """', DP 8, EP 8, PP 2' for the sizes above 1 (attention DP, experts, stages)."""
    sizes = (("DP", e.data_parallel_size), ("EP", e.expert_parallel_size), ("PP", e.pipeline_parallel_size))
    return "".join(f", {name} {v}" for name, v in sizes if v > 1)


def _notes(cfg: StudyConfig, wall: float, n_points: int, axes: Sequence[str] = ()) -> list[str]:
    w, c = cfg.workload, cfg.cluster
    # A lone replica runs with its cluster.replicas entry applied (as replica 0 of a cluster).
    one = replica_config(cfg, 0) if c.num_replicas == 1 else cfg
    e, s = one.engine, one.scheduler
    trace = w.trace or "synthetic lengths"
    cluster = []
    if c.num_replicas > 1:
        cluster = [f"cluster: {c.num_replicas} replicas behind router {c.router}"
                   + (f" ({len(c.replicas)} with their own [engine]/[scheduler] overrides)"
                      if c.replicas else "")]
    elif c.replicas and c.replicas[0]:
        cluster = ["the one replica takes its cluster.replicas entry: "
                   + ", ".join(f"{k.split('.', 1)[1]} = {v!r}" for k, v in c.replicas[0].items())]
    return cluster + closed_loop_note(w, axes) + unused_tier_note(cfg, axes) + [
        f"{e.model} on {e.tensor_parallel_size * e.data_parallel_size * e.pipeline_parallel_size}x "
        f"{e.hardware} (TP {e.tensor_parallel_size}{_layout(e)}), "
        f"{e.cost_model} cost model; policy {s.policy}, chunked prefill "
        f"{s.enable_chunked_prefill}, prefix caching {s.enable_prefix_caching}, "
        f"block size {s.block_size}, max_model_len {s.max_model_len}",
        f"workload: {w.num_requests} requests"
        + (" (every row of the trace: num_requests not set)" if cfg.num_requests_from_trace else "")
        + f", {'closed-loop clients' if w.concurrency else 'arrivals ' + w.arrival}, lengths "
        f"{w.prompt_dist}/{w.output_dist} ({trace}); over-long: {w.on_overlong}; seed {cfg.run.seed}",
        one.speculative.describe(),
        f"SLOs for goodput: TTFT <= {cfg.slo.ttft_s} s, TPOT <= {cfg.slo.tpot_s} s",
        f"{n_points} point(s) simulated in {wall:.1f} s wall",
    ]


def unused_tier_note(cfg: StudyConfig, axes: Sequence[str] = ()) -> list[str]:
    """A line naming [kv_offload] settings that go unused because the study has no host tier (never silent)."""
    k = cfg.kv_offload
    if k.enabled or {"host_size_gib", "host_blocks"} & set(axes):
        return []
    unused = [f"{name} = {getattr(k, name)!r}" for name, default in
              (("eviction", "lru"), ("bandwidth", -1.0), ("latency_s", -1.0)) if getattr(k, name) != default]
    if not unused:
        return []
    return [f"host KV tier: off (host_size_gib and host_blocks are 0), so [kv_offload] {', '.join(unused)} "
            "went unused; set host_size_gib or host_blocks to add the tier"]


def closed_loop_note(w: Any, axes: Sequence[str] = ()) -> list[str]:
    """The line that says a study runs closed-loop clients (none for open-loop arrivals)."""
    if "concurrency" in axes:  # each point has its own: the table's column
        line = (f"closed loop: concurrency clients (the column), think {w.think_time_s:g} s, "
                f"{w.warmup_requests} warm-up requests")
    elif w.concurrency:
        line = closed_loop_line(w)
    else:
        return []
    return [line + " (left out of the metrics; throughput over the measured window, first "
            "measured send to last measured finish)"]


def beyond_fit_note(res: Sequence[Any]) -> list[str]:
    """A note when a measured profile priced steps larger than any it was fitted on."""
    shares = [float(r.row.get("busy_beyond_fit") or 0.0) for r in res]
    hit = [x for x in shares if x > 0]
    if not hit:
        return []
    return [f"extrapolated: in {len(hit)} of {len(res)} point(s) the profile priced up to {max(hit):.0%} "
            "of the busy time in steps larger than any it was fitted on (busy_beyond_fit, "
            "steps_beyond_fit); calibrate with longer contexts or larger batches to measure them"]


def build_parser() -> argparse.ArgumentParser:
    """The `simulate` parser: run, sweep, search and fields."""
    # No abbreviations: `--mode` must not pass for `--model` (a misread flag runs the wrong study).
    ap = argparse.ArgumentParser(prog="simulate", description=__doc__.splitlines()[0], allow_abbrev=False,
                                 epilog="`simulate fields` lists every study field with its default, "
                                        "range and meaning (docs/knobs.md).")
    ap.add_argument("--out", default=None,
                    help="output folder (default: simulate-out, or simulate-COMMAND)")
    ap.add_argument("--workers", type=workers_arg, default=None,
                    help="processes that simulate points in parallel (default: the CPUs)")
    sub = ap.add_subparsers(dest="command")
    helps = {"run": "simulate one study", "sweep": "simulate every point of a grid of field values",
             "search": "the highest rate each configuration sustains within the SLOs, and its cost"}
    for name in ("run", "sweep", "search"):
        p = sub.add_parser(name, help=helps[name], allow_abbrev=False)
        p.add_argument("--config", help="study TOML file (every field has a default)")
        p.add_argument("--set", action="append", metavar="FIELD=VALUE",
                       help="override one config field, as section.field or a bare unique name "
                            "(repeatable; `simulate fields` lists them)")
        p.add_argument("--seed", type=int, help="run.seed: the seed of every random stream")
        p.add_argument("--requests", type=int, help="workload.num_requests")
        p.add_argument("--no-fast-forward", action="store_true", help="step one event per step")
        # SUPPRESS: an unset subcommand flag must not overwrite the same flag given before it.
        p.add_argument("--out", default=argparse.SUPPRESS, help="output folder")
        p.add_argument("--workers", type=workers_arg, default=argparse.SUPPRESS,
                       help="processes that simulate points in parallel")
        if name in ("sweep", "search"):
            p.add_argument("--grid", action="append", default=[], metavar="FIELD=A,B,C",
                           required=name == "sweep", help="one sweep axis (repeatable)")
            p.add_argument("--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                           help="run points as Ray tasks: on the cluster at ADDRESS, or on a "
                                "local Ray when no address is given")
        if name == "search":
            p.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS",
                           help="e.g. ttft_p99=2, tpot_p99=0.1 (repeatable; default: [slo] "
                                "ttft_s and tpot_s as p99)")
            p.add_argument("--target-rate", type=float, default=None,
                           help="req/s to provision for (cheapest configuration)")
            p.add_argument("--tolerance", type=float, default=None,
                           help="stop when the rate bracket is within this fraction (0.02)")
    f = sub.add_parser("fields", help="every study field: default, what it takes, meaning", allow_abbrev=False)
    f.add_argument("section", nargs="?", default=None, help="one table, e.g. workload (default: all)")
    from twinserve.sim.validate_cli import add_parser
    add_parser(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `simulate` script."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command == "validate":
        from twinserve.sim.validate_cli import run_validate
        return run_validate(args)
    if args.command == "fields":
        from twinserve.sim.config import SECTIONS, section_table

        if args.section is not None and args.section not in SECTIONS:
            print(f"simulate: error: no table [{args.section}]; known: {', '.join(SECTIONS)}", file=sys.stderr)
            return 2
        for name in SECTIONS if args.section is None else [args.section]:
            print(f"[{name}]\n\n{section_table(name)}")
        return 0
    if args.command == "search":
        from twinserve.sim.search_cli import run_search
        return run_search(args, _base)
    failures: list[PointFailure] = []
    try:
        cfg = _base(args)
        t0 = time.perf_counter()
        if args.command == "run":
            res = [run_point(cfg)]
            axes: list[str] = []
        else:
            grid = parse_grid(args.grid) if args.command == "sweep" else DEFAULT_GRID
            axes = [k.split(".", 1)[1] for k in grid]
            res = run_grid(cfg, grid, workers=args.workers, ray_address=getattr(args, "ray", None),
                           failures=failures)
            if not res:
                raise PointError(failures)
        wall = time.perf_counter() - t0
        out = Path(args.out or (f"simulate-{args.command}" if args.command else "simulate-out"))
        title = cfg.run.name if args.command is None else f"simulate {args.command}: {cfg.run.name}"
        # Loaded on use: pandas' plotting and matplotlib (~0.3 CPU s) are no part of `search`'s start.
        from twinserve.sim.report import write_study

        written = write_study(out, res, axes, title, _notes(cfg, wall, len(res), axes) + beyond_fit_note(res),
                              slo=cfg.slo)
    except (TwinserveError, OSError) as e:
        print(f"simulate: error: {e}", file=sys.stderr)
        return 2
    print((out / "summary.md").read_text())
    print(f"wrote {', '.join(str(p) for p in written.values())}")
    for f in failures:
        print(f"simulate: error: {f.describe()}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
