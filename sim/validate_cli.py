"""`simulate validate --silicon`: filters, the runs (processes or Ray), validation.csv and summary.json."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from twinserve.core.errors import TwinserveError
from twinserve.core.provenance import git_commit

from twinserve.sim.runner import LOCAL_RAY, PointFailure, run_jobs, workers_arg
from twinserve.sim.validate import (expressible, finish_record, preload_aic, row_record, simulate_row,
                                    summarize_validation, summary_table)
from twinserve.sim.validate_layouts import DEFAULT_DISAGG_ASSUMPTION, DISAGG_ASSUMPTIONS
from twinserve.sim.validate_rows import SiliconDataError, load_rows, row_study
from twinserve.sim.validate_protocol import DEFAULT_WINDOW, WINDOWS
from twinserve.sim.validate_reduce import DEFAULT_REDUCTION, REDUCTIONS


def add_parser(sub: Any) -> None:
    """The `validate` subcommand's flags."""
    p = sub.add_parser("validate", help="simulate aiconfigurator-core's measured rows and report the errors",
                       allow_abbrev=False)
    p.add_argument("--silicon", action="store_true", required=True,
                   help="judge against aiconfigurator-core's silicon_sample.csv (the only source so far)")
    p.add_argument("--backend", help="vllm, sglang or trtllm")
    p.add_argument("--system", help="e.g. h200_sxm, b200_sxm, gb200")
    p.add_argument("--model", help="e.g. Llama-3.1-70B or meta-llama/Llama-3.1-70B")
    p.add_argument("--cost-model", default="roofline", help="roofline (default) or aic")
    p.add_argument("--rows", choices=("dev", "heldout", "all"), default="all",
                   help="development rows (Llama-3.1-70B, Qwen3-32B, gpt-oss-120b, DeepSeek-R1), the rest, or all")
    p.add_argument("--layout", choices=("all", "given", "assumed"), default="all",
                   help="rows whose layout the file gives whole, rows where part of it is assumed or inferred "
                        "(the layout column), or all")
    p.add_argument("--window", choices=WINDOWS, default=DEFAULT_WINDOW,
                   help="benchmark: as the row's benchmark ran and counted (10 N requests, all counted, lengths "
                        "on [0.8 L, L]), rows of 64+ clients estimated from their first 4 waves (3 from 256 "
                        "clients) and a drain wave (validate_estimate.py); benchmark-full: every row's 10 N "
                        "requests simulated; steady: cold wave left out, one wave measured, fixed lengths")
    p.add_argument("--reduce", choices=REDUCTIONS, default=DEFAULT_REDUCTION,
                   help="replicas: simulate a disaggregated row's cluster as a 1/g slice (P/g prefill and D/g "
                        "decode workers, N/g clients; g = gcd(P, D, N); the reduction column says so; "
                        "validate_reduce.py); none: every worker and client")
    p.add_argument("--estimate-waves", type=int, default=None, metavar="K",
                   help="waves simulated before the drain wave in a row estimated under --window benchmark "
                        "(2-9; default: 3 from 256 clients on, else 4; validate_estimate.py)")
    p.add_argument("--max-clients", type=int, default=None,
                   help="only rows of at most N clients (the benchmark window sends 10 N requests a row)")
    p.add_argument("--limit", type=int, default=None,
                   help="at most N rows, spread evenly over the filtered rows (a stratified subset)")
    p.add_argument("--out", default=argparse.SUPPRESS, help="output folder")
    p.add_argument("--workers", type=workers_arg, default=argparse.SUPPRESS,
                   help="processes that simulate rows in parallel")
    p.add_argument("--assume-disagg", choices=DISAGG_ASSUMPTIONS + ("none",), default=DEFAULT_DISAGG_ASSUMPTION,
                   help="how a disaggregated row without prefill/decode worker counts is expressed "
                        "(flagged in the layout column; docs/validate-rows.md), or none: not expressed")
    p.add_argument("--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                   help="run rows as Ray tasks: on the cluster at ADDRESS, or a local Ray")
    p.add_argument("--resume", action="store_true",
                   help="keep the studies an interrupted run into the same --out finished (OUT/rows.jsonl, "
                        "written as each study ends, removed once validation.csv is written) and run only the "
                        "rest; refused if the journal's settings or git commit differ from this run's")


class FilterError(SiliconDataError):
    """A --backend/--system/--model/--limit/--cost-model value that matches nothing; names what exists."""


class JournalError(SiliconDataError):
    """OUT/rows.jsonl cannot be resumed (other settings or code) or would be overwritten unasked."""


JOURNAL = "rows.jsonl"


def _json_value(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} in a validate result")


class Journal:
    """OUT/rows.jsonl: the finished studies of a run, one JSON line each as it ends.

    A long run that is stopped (Ctrl-C, a killed job, a lost machine) keeps what it finished;
    `--resume` runs only the rest. Its first line holds the run's settings and git commit: a
    journal is resumed only by the same settings on the same code, so one validation.csv never
    mixes predictions of two versions. Studies are keyed by a hash of their whole study
    (study_key), so a resumed run may filter rows differently and still reuse every match.
    """

    def __init__(self, path: Path, settings: dict[str, Any], resume: bool) -> None:
        self.path = path
        self.header = {"twinserve_validate_journal": 1, "settings": settings, "git_commit": git_commit()}
        self.done: dict[str, dict[str, Any]] = {}
        try:
            held = path.exists() and sum(1 for line in path.read_text().splitlines() if line.strip()) > 1
        except (OSError, UnicodeDecodeError) as e:
            raise JournalError(f"{path}: not a readable validate journal ({type(e).__name__}): remove it or "
                               "choose another --out") from None
        if held and not resume:
            raise JournalError(f"{path} holds the studies an earlier run finished before it stopped: pass "
                               "--resume to keep them and run the rest, or remove the file (or choose "
                               "another --out) to start again")
        if held:
            self.done = self._read()  # rewrites the file: its header and the studies kept
            self._file = path.open("a")
        else:
            self._file = path.open("w")
            self._write(self.header)

    def _read(self) -> dict[str, dict[str, Any]]:
        lines = self.path.read_text().split("\n")
        try:
            head = json.loads(lines[0])
        except json.JSONDecodeError:
            raise JournalError(f"{self.path}:1: not a validate journal (no JSON header line)") from None
        if head.get("twinserve_validate_journal") != 1:
            raise JournalError(f"{self.path}:1: not a validate journal")
        for k in ("settings", "git_commit"):
            if head.get(k) != self.header[k]:
                raise JournalError(f"{self.path}: written with {k} {head.get(k)!r}, this run has "
                                   f"{self.header[k]!r}: resuming would mix two kinds of prediction in one "
                                   "validation.csv; run with the journal's settings, or remove it to start again")
        done: dict[str, dict[str, Any]] = {}
        last = max(i for i, line in enumerate(lines) if line.strip())
        for i, line in enumerate(lines[1:], 2):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                done[str(d["study"])] = dict(d["result"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                if i - 1 == last:  # the line a stopped run was writing: that study runs again
                    break
                raise JournalError(f"{self.path}:{i}: not a journal entry (a study and its result)") from None
        # Rewritten whole, so a half-written last line cannot stay in the middle of the file.
        self.path.write_text("".join(json.dumps(x) + "\n" for x in
                                     [self.header] + [{"study": k, "result": v} for k, v in done.items()]))
        return done

    @staticmethod
    def key(study: str) -> str:
        import hashlib
        return hashlib.sha256(study.encode()).hexdigest()[:32]

    def add(self, key: str, row_id: str, result: dict[str, Any]) -> None:
        self._write({"study": key, "row": row_id, "result": result})

    def _write(self, obj: dict[str, Any]) -> None:
        self._file.write(json.dumps(obj, default=_json_value) + "\n")
        self._file.flush()

    def finish(self) -> None:
        """The run's files are written: the journal has served."""
        self._file.close()
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        self._file.close()


def select_rows(df: pd.DataFrame, backend: str | None = None, system: str | None = None,
                model: str | None = None, rows: str = "all", limit: int | None = None,
                layout: str = "all", disagg: str | None = DEFAULT_DISAGG_ASSUMPTION) -> pd.DataFrame:
    """The rows the filters keep; FilterError naming the known values when one matches nothing."""
    for col, value in (("backend", backend), ("system", system)):
        if value is not None:
            known = sorted(df[col].dropna().unique())
            if value.lower() not in [k.lower() for k in known]:
                raise FilterError(f"--{col} {value!r}: no such {col} in the rows; known: {', '.join(known)}")
            df = df[df[col].str.lower() == value.lower()]
    if model is not None:
        m = model.lower()
        hit = (df["model"].str.lower() == m) | (df["model_path"].str.lower() == m)
        if not hit.any():
            known = sorted(df["model"].unique())
            raise FilterError(f"--model {model!r}: no rows for it here; known: {', '.join(known)}")
        df = df[hit]
    if rows != "all":
        kept = df[df["split"] == rows]
        if kept.empty:
            raise FilterError(f"--rows {rows}: none of the {len(df)} rows the other filters keep is a "
                              f"{'development' if rows == 'dev' else 'held-out'} row (all are "
                              f"{', '.join(sorted(df['split'].unique()))}); leave --rows out or change it")
        df = kept
    if layout != "all":  # '' = the file gives the whole layout (unexpressible rows count as given)
        assumed = df.apply(lambda r: row_record(r, disagg=disagg)["layout"] != "", axis=1).astype(bool)
        kept = df[assumed if layout == "assumed" else ~assumed]
        if kept.empty:
            raise FilterError(f"--layout {layout}: none of the {len(df)} rows the other filters keep has "
                              f"{'an assumed or inferred' if layout == 'assumed' else 'its whole'} layout "
                              "(docs/validate-rows.md); leave --layout out or change it")
        df = kept
    if limit is not None:
        if limit < 1:
            raise FilterError(f"--limit {limit}: must be >= 1")
        if limit < len(df):
            df = df.iloc[np.unique(np.linspace(0, len(df) - 1, limit).round().astype(int))]
    if df.empty:
        raise FilterError("the filters leave no rows")
    return df


def within_clients(df: pd.DataFrame, max_clients: int | None) -> pd.DataFrame:
    """The rows of at most max_clients clients (all when None); FilterError when none is left."""
    if max_clients is None:
        return df
    if max_clients < 1:
        raise FilterError(f"--max-clients {max_clients}: must be >= 1")
    kept = df[~(df["concurrency"] > max_clients)]  # rows without a concurrency stay: their reason is reported
    if kept.empty:
        raise FilterError(f"--max-clients {max_clients}: no row has so few clients "
                          f"(least: {int(df['concurrency'].min())})")
    return kept


def _check_cost_model(name: str) -> None:
    from twinserve.core.knobs import knob_of
    from twinserve.sim.config import EngineConfig
    allowed = knob_of(EngineConfig.__dataclass_fields__["cost_model"]).choice_list()
    if name not in ("roofline", "aic") or name not in allowed:
        have = ", ".join(c for c in allowed if c != "fitted")
        raise FilterError(f"--cost-model {name!r}: this build has {have}"
                          + (" (the measured backend, 'aic', is not merged yet)" if name == "aic" else ""))


def study_key(row: pd.Series, cost_model: str, disagg: str | None = DEFAULT_DISAGG_ASSUMPTION,
              window: str = DEFAULT_WINDOW) -> str:
    """The row's simulated study, written out (rows with equal keys make the same run)."""
    cfg = row_study(row, cost_model, disagg=disagg, window=window)
    # The run's name is a label (the row's id); the backend stays in the key because its front-end
    # latency is added after the run (validate_engines.py), so two backends never share a prediction.
    cfg.run.name = str(row["backend"])
    return repr(cfg)


def cost_estimate(row: dict[str, Any]) -> float:
    """A row's relative simulation cost, to start the longest first (experiments/validate_speed.py).

    The simulated request-steps: every request's OSL decode steps in batches of N, its prompt in
    8,192-token chunks; disaggregated rows run every worker.
    """
    conc = float(row.get("concurrency") or 1)
    isl, osl = float(row["isl"]), float(row["osl"])
    return conc * conc * (osl + isl / 512.0) * (2.0 if row.get("mode") == "disagg" else 1.0)


# A worker process holding more than this after a study is replaced by a fresh one (sim.runner._Workers).
# Each study's run is freed by reference counting (sim.validate._free_run); what a big study still leaves
# (the allocator's arenas, the spare block pool) goes back to the system only at the process's end.
# Before both, one worker grew to 12.8 GB over the head studies and was killed for memory
# (docs/validate-speed.md, "Worker memory"). The costliest study alone peaks at 1.8-2.2 GB.
WORKER_RSS_LIMIT = 3 << 29  # 1.5 GiB


def run_validation(df: pd.DataFrame, cost_model: str, workers: int | None, ray: str | None,
                   progress: bool = True, disagg: str | None = DEFAULT_DISAGG_ASSUMPTION,
                   window: str = DEFAULT_WINDOW, reduce: str = DEFAULT_REDUCTION,
                   waves: int | None = None, journal: Journal | None = None) -> pd.DataFrame:
    """Every row of df: its reason, or its prediction and errors; one record per row, in order.

    waves: K of the rows estimated from their first waves (None: by their clients, validate_estimate.py).
    journal: each finished study is written to it as it ends; studies it already holds are not run.

    Rows whose studies are equal (e.g. the same model, layout and lengths at two backend versions
    the roofline prices alike) run once: the later ones copy the first one's prediction and name it
    in `same_study_as`. Rows start longest first, so no long row starts last.
    """
    records: list[dict[str, Any]] = []
    jobs: list[tuple[Any, ...]] = []
    where: list[int] = []
    first_of: dict[str, int] = {}  # study -> its job
    keys: list[str] = []  # each job's journal key
    copies: list[tuple[int, int]] = []  # (record, job) of rows that repeat a study
    for _, row in df.iterrows():
        rec = row_record(row, disagg=disagg)
        reason = expressible(row, cost_model, disagg=disagg)
        rec["expressible"] = not reason
        rec["reason"] = reason
        rec["same_study_as"] = ""
        records.append(rec)
        if not reason:
            key = study_key(row, cost_model, disagg, window)
            if key in first_of:
                copies.append((len(records) - 1, first_of[key]))
                continue
            first_of[key] = len(jobs)
            where.append(len(records) - 1)
            keys.append(Journal.key(key))
            jobs.append((row.to_dict(), cost_model, {"disagg": disagg, "window": window, "reduce": reduce,
                                                     "waves": waves}))
    out: list[Any] = [None] * len(jobs)
    kept = journal.done if journal is not None else {}
    for j in range(len(jobs)):
        if keys[j] in kept:
            out[j] = kept[keys[j]]
    if kept and progress:
        print(f"resuming: {sum(r is not None for r in out)} of {len(jobs)} studies kept from {journal.path}",
              file=sys.stderr)
    order = sorted((j for j in range(len(jobs)) if out[j] is None), key=lambda j: -cost_estimate(jobs[j][0]))

    if (cost_model == "aic" and ray is None and len(order) > 1
            and min(workers or os.cpu_count() or 1, len(order)) > 1 and multiprocessing.get_start_method() == "fork"):
        # The workers fork from this process: what it loaded, they share (preload_aic).
        t0 = time.perf_counter()
        if progress:
            print("aic: loading the kernel tables once for the workers ...", file=sys.stderr, flush=True)
        built = preload_aic([jobs[j] for j in order])
        if progress:
            print(f"aic: the tables of {built} distinct studies loaded in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)

    def journaled(pos: int, res: Any) -> None:
        if journal is not None and not isinstance(res, PointFailure):  # a failed study runs again
            journal.add(keys[order[pos]], str(jobs[order[pos]][0]["id"]), res)
    ran = run_jobs(simulate_row, [jobs[j] for j in order], [{"row": jobs[j][0]["id"]} for j in order],
                   workers, ray, "validate", progress, on_result=journaled, max_worker_rss=WORKER_RSS_LIMIT)
    for pos, j in enumerate(order):
        out[j] = ran[pos]
    for i, res in zip(where, out):
        if isinstance(res, PointFailure):
            records[i] = finish_record(records[i], None, res.error)
        else:
            records[i] = finish_record(records[i], res)
    for i, j in copies:
        res = out[j]
        records[i]["same_study_as"] = jobs[j][0]["id"]
        if isinstance(res, PointFailure):
            records[i] = finish_record(records[i], None, res.error)
        else:
            records[i] = finish_record(records[i], {**res, "sim_wall_s": 0.0, "sim_cpu_s": 0.0})
    for i, rec in enumerate(records):
        if "err_tpot" not in rec:
            records[i] = finish_record(rec, None)
    return pd.DataFrame(records)


def run_validate(args: argparse.Namespace) -> int:
    """The `simulate validate` command: exit 0; 2 with the reason on bad input (nothing written); 3 when
    the rows the filters keep include none it can express (both files written, the reasons on stderr)."""
    t0 = time.perf_counter()
    try:
        _check_cost_model(args.cost_model)
        disagg = None if args.assume_disagg == "none" else args.assume_disagg
        df = select_rows(load_rows(), args.backend, args.system, args.model, args.rows, args.limit,
                         args.layout, disagg)
        df = within_clients(df, getattr(args, "max_clients", None))
        window = getattr(args, "window", DEFAULT_WINDOW)
        reduce = getattr(args, "reduce", DEFAULT_REDUCTION)
        waves = getattr(args, "estimate_waves", None)
        if waves is not None and not 2 <= waves <= 9:
            raise FilterError(f"--estimate-waves {waves}: allowed 2 .. 9 (the benchmark sends 10 waves)")
        out = Path(getattr(args, "out", None) or "simulate-validate")
        out.mkdir(parents=True, exist_ok=True)
        journal = Journal(out / JOURNAL, {"cost_model": args.cost_model, "assume_disagg": args.assume_disagg,
                                          "window": window, "reduce": reduce, "estimate_waves": waves},
                          getattr(args, "resume", False))
        try:
            frame = run_validation(df, args.cost_model, getattr(args, "workers", None), args.ray, disagg=disagg,
                                   window=window, reduce=reduce, waves=waves, journal=journal)
        except KeyboardInterrupt:
            journal.close()
            print(f"\nsimulate: interrupted: the finished studies are kept in {journal.path}; run the same "
                  "command with --resume to run only the rest", file=sys.stderr)
            return 130
        summary = summarize_validation(frame)
        wall = time.perf_counter() - t0
        ran = frame[frame["sim_wall_s"].fillna(0) > 0] if "sim_wall_s" in frame else frame.iloc[:0]
        summary["run"] = {"cost_model": args.cost_model, "assume_disagg": args.assume_disagg,
                          "rows": int(len(frame)), "wall_s": round(wall, 1),
                          # Worker CPU seconds over every study simulated, resumed ones included: the
                          # run's cost on a quiet machine (wall / workers at best), whatever the load.
                          "studies_cpu_s": round(float(ran["sim_cpu_s"].sum()), 1) if "sim_cpu_s" in ran else None,
                          "studies_resumed": len(journal.done),
                          "loop": sorted(frame["loop"].dropna().unique()) if "loop" in frame else [],
                          "window": window, "reduce": reduce, "estimate_waves": waves or "auto",
                          "filters": {k: getattr(args, k) for k in ("backend", "system", "model", "rows", "layout",
                                                                    "limit", "max_clients")}}
        frame.to_csv(out / "validation.csv", index=False)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        broken = int(frame["sim_error"].astype(str).str.len().gt(0).sum())
        if broken:
            # Failed studies are not journaled: --resume runs just them (a study whose worker died
            # twice is one: sim.runner._Workers).
            journal.close()
            print(f"simulate: {broken} rows failed in the simulator (column sim_error); {journal.path} is kept: "
                  "the same command with --resume runs only the failed studies", file=sys.stderr)
        else:
            journal.finish()
    except (TwinserveError, OSError) as e:
        print(f"simulate: error: {e}", file=sys.stderr)
        return 2
    print(summary_table(summary))
    failed = frame["sim_error"].astype(bool).sum()
    o = summary["all"]["overall"]
    print(f"expressible as given {o['expressible_as_given']}, with an assumed or inferred layout "
          f"{o['expressible_assumed']} (--assume-disagg {args.assume_disagg})")
    if "aic_version" in frame:
        other = int(frame["aic_version"].fillna("").astype(str).str.contains("aic's current").sum())
        if other:
            print(f"{other} rows priced by aic's current database: their own backend version is not installed "
                  "or not given (column aic_version)")
    print(f"{len(frame)} rows, {int(frame['expressible'].sum())} expressible, {failed} failed in the simulator; "
          f"{wall:.1f} s wall; wrote {out / 'validation.csv'}, {out / 'summary.json'}")
    if not frame["expressible"].any():  # nothing judged: not a success (docs/capacity.md, exits)
        reasons = frame["reason"].value_counts()
        top = "; ".join(f"{n} x {why}" for why, n in reasons.head(3).items())
        more = f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
        print(f"simulate: error: none of the {len(frame)} rows is expressible, so nothing was simulated or "
              f"judged: {top}{more} (each row's reason is in validation.csv)", file=sys.stderr)
        return 3
    return 0
