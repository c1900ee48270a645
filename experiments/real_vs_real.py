"""The real engine against itself across two calls: two recorded fidelity runs of one workload.

`twinserve fidelity --repeats K` sets later runs beside the first within one call, back to back.
This script does the same for two separate calls, e.g. two `experiments/fidelity_study.py`
studies made with the same command an hour apart: for every cell (a fidelity run directory)
that both hold, it judges the second call's real run as if it were a prediction of the first
one's, by the same target cells as `fidelity` (TTFT, TPOT and E2E within 5% at p50 and 10% at
p99), and sets that beside how many cells each call's simulator met against its own run. It
also sets the simulators' change from A to B (each priced at the speed sampled through its own
run) beside the real change: how much of what the machine did between the calls the twin
follows.

It refuses runs of different workloads: the requests (ids, arrivals, prompt and output
lengths) must be the same on both sides.

    python experiments/real_vs_real.py STUDY_A STUDY_B [--json OUT]
    python experiments/real_vs_real.py --pool STUDY [STUDY ...] [--json OUT]

With --pool it judges the simulator against every real run of each cell pooled instead, as
`fidelity --repeats` pools one call's runs: each run's requests against that run's own
prediction (requests_sim.csv), the repeats inside a run directory (repeat-J/) included. A
miss that pooling more runs does not shrink is the model's, not the machine's noise.

Either argument may be a study directory (one fidelity run per subdirectory) or one fidelity
run directory (holding fidelity.json and requests_real.csv).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from twinserve.twin.compare import TARGET_METRICS, compare, targets
from twinserve.twin.fidelity import read_requests, tagged


class RunMismatch(ValueError):
    """The two runs did not serve the same requests."""


def runs_in(path: Path) -> dict[str, Path]:
    """The fidelity run directories under path, by name ('.' for path itself)."""
    if (path / "fidelity.json").is_file():
        return {".": path}
    found = {p.parent.name: p.parent for p in sorted(path.glob("*/fidelity.json"))}
    if not found:
        raise FileNotFoundError(f"{path}: no fidelity.json in it or in its subdirectories")
    return found


def _workload_key(records: list[Any]) -> list[tuple[str, float, int, int]]:
    return sorted((r.request_id, round(r.arrival_time, 6), r.num_prompt_tokens, r.num_output_tokens)
                  for r in records)


def judge_pair(run_a: Path, run_b: Path) -> dict[str, Any]:
    """Run B's real requests judged as a prediction of run A's, beside each run's simulator."""
    real_a, real_b = (read_requests(d / "requests_real.csv") for d in (run_a, run_b))
    if _workload_key(real_a) != _workload_key(real_b):
        raise RunMismatch(f"{run_a} and {run_b} did not serve the same requests (ids, arrivals, lengths)")
    both = compare(real_a, real_b)
    t = targets(both["metrics"], judged_on="real run B against real run A")
    rep_a, rep_b = (json.loads((d / "fidelity.json").read_text()) for d in (run_a, run_b))

    def sim_met(rep: dict[str, Any]) -> int | None:
        return (rep.get("targets") or {}).get("met")

    def sampled(rep: dict[str, Any]) -> float | None:
        return ((rep.get("speed") or {}).get("sampled") or {}).get("mean_factor")

    sim_b_vs_a = None
    if "metrics" in rep_a and "metrics" in rep_b:
        sim_b_vs_a = {m: {q: rep_b["metrics"][m][q]["sim"] / rep_a["metrics"][m][q]["sim"] - 1.0
                          for q in t["cells"][m]} for m in t["cells"]}
    return {"real_b_vs_a": {m: {q: c["err"] for q, c in per.items()} for m, per in t["cells"].items()},
            "sim_b_vs_a": sim_b_vs_a, "met": t["met"], "of": t["of"],
            "sim_met_a": sim_met(rep_a), "sim_met_b": sim_met(rep_b),
            "sampled_speed_a": sampled(rep_a), "sampled_speed_b": sampled(rep_b),
            "num_requests": len(real_a)}


def judge(a: Path, b: Path) -> dict[str, Any]:
    """Every run the two paths share, judged by judge_pair, and the totals."""
    runs_a, runs_b = runs_in(a), runs_in(b)
    common = sorted(set(runs_a) & set(runs_b))
    if not common:
        raise RunMismatch(f"{a} and {b} share no run directory (A: {sorted(runs_a)}, B: {sorted(runs_b)})")
    cells = {name: judge_pair(runs_a[name], runs_b[name]) for name in common}

    def total(key: str) -> int | None:
        vals = [c[key] for c in cells.values()]
        return None if any(v is None for v in vals) else sum(vals)

    return {"a": str(a), "b": str(b), "runs": cells, "met": total("met"), "of": total("of"),
            "sim_met_a": total("sim_met_a"), "sim_met_b": total("sim_met_b"), "followed": followed(cells)}


def run_dirs(path: Path) -> dict[str, list[Path]]:
    """Every recorded real run under path, by cell: the run directory, then its repeat-J/."""
    def order(d: Path) -> int:
        return int(d.name.split("-", 1)[1]) if d.name.split("-", 1)[1].isdigit() else 0

    return {name: [d] + sorted((r for r in d.glob("repeat-*") if (r / "requests_real.csv").is_file()), key=order)
            for name, d in runs_in(path).items()}


def pooled(paths: list[Path]) -> dict[str, Any]:
    """The simulator against every real run of each cell the paths share, pooled."""
    found = [run_dirs(p) for p in paths]
    common = sorted(set.intersection(*(set(f) for f in found)))
    if not common:
        raise RunMismatch(f"{', '.join(map(str, paths))} share no run directory")
    cells: dict[str, Any] = {}
    for name in common:
        dirs = [d for f in found for d in f[name]]
        reals = [read_requests(d / "requests_real.csv") for d in dirs]
        real, sim = [], []
        for j, (d, got) in enumerate(zip(dirs, reals)):
            if _workload_key(got) != _workload_key(reals[0]):
                raise RunMismatch(f"{dirs[0]} and {d} did not serve the same requests (ids, arrivals, lengths)")
            if not (d / "requests_sim.csv").is_file():
                raise FileNotFoundError(f"{d}: no requests_sim.csv (the simulator's prediction of the run)")
            real += tagged(got, j)
            sim += tagged(read_requests(d / "requests_sim.csv"), j)
        t = targets(compare(real, sim)["metrics"], judged_on=f"pooled over {len(dirs)} real runs")
        cells[name] = {"runs": len(dirs), "met": t["met"], "of": t["of"],
                       "err": {m: {q: c["err"] for q, c in per.items()} for m, per in t["cells"].items()}}
    return {"paths": [str(p) for p in paths], "runs": cells, "met": sum(c["met"] for c in cells.values()),
            "of": sum(c["of"] for c in cells.values())}


def pooled_table(res: dict[str, Any]) -> str:
    """Markdown: per cell, the pooled signed errors and the cells met."""
    quants = list(next(iter(res["runs"].values()))["err"][TARGET_METRICS[0]])
    head = ["run", "real runs"] + [f"{m.upper()} {q}" for m in TARGET_METRICS for q in quants] + ["met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, c in res["runs"].items():
        errs = [f"{100 * c['err'][m][q]:+.1f}" for m in TARGET_METRICS for q in quants]
        lines.append("| " + " | ".join([name, str(c["runs"])] + errs + [f"{c['met']}/{c['of']}"]) + " |")
    lines += ["", f"the simulator against the real runs pooled (errors in %): {res['met']} of {res['of']} "
              "target cells met"]
    return "\n".join(lines)


def followed(cells: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """How far the simulators' change from A to B follows the real change, over every target
    cell of every run, in log ratios: their correlation, the real change's rms, and the rms of
    what is left of it once the simulators' change is taken out (None without both sides' sim)."""
    pairs = [(math.log1p(c["real_b_vs_a"][m][q]), math.log1p(c["sim_b_vs_a"][m][q]))
             for c in cells.values() if c["sim_b_vs_a"] is not None
             for m in c["real_b_vs_a"] for q in c["real_b_vs_a"][m]]
    if len(pairs) < 2 or len(pairs) < sum(len(per) for c in cells.values() for per in c["real_b_vs_a"].values()):
        return None
    real, sim = (np.array(v) for v in zip(*pairs))
    corr = float(np.corrcoef(real, sim)[0, 1]) if real.std() > 0 and sim.std() > 0 else float("nan")
    return {"values": len(pairs), "correlation": corr, "real_rms": float(np.sqrt(np.mean(real ** 2))),
            "left_rms": float(np.sqrt(np.mean((real - sim) ** 2)))}


def report_table(res: dict[str, Any]) -> str:
    """Markdown: per run, real B's signed error against real A and the cells each side met."""
    quants = list(next(iter(res["runs"].values()))["real_b_vs_a"][TARGET_METRICS[0]])
    head = (["run"] + [f"{m.upper()} {q}" for m in TARGET_METRICS for q in quants]
            + ["real B vs A met", "sim met (A / B)", "sampled speed (A / B)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def num(v: float | None, fmt: str) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    for name, c in res["runs"].items():
        errs = [num(100 * c["real_b_vs_a"][m][q], "+.1f") for m in TARGET_METRICS for q in quants]
        sims = f"{num(c['sim_met_a'], 'd')} / {num(c['sim_met_b'], 'd')}"
        speeds = f"{num(c['sampled_speed_a'], '.3f')} / {num(c['sampled_speed_b'], '.3f')}"
        lines.append("| " + " | ".join([name] + errs + [f"{c['met']}/{c['of']}", sims, speeds]) + " |")
    sims = (f"; the simulators met {res['sim_met_a']} and {res['sim_met_b']} against their own runs"
            if res["sim_met_a"] is not None and res["sim_met_b"] is not None else "")
    lines += ["", f"real B against real A (errors in %): {res['met']} of {res['of']} target cells met{sims}"]
    f = res.get("followed")
    if f:
        lines.append(f"the simulators' change from A to B against the real one, over {f['values']} cell values "
                     f"(log ratios): correlation {f['correlation']:.2f}; the real change {f['real_rms']:.1%} rms, "
                     f"{f['left_rms']:.1%} rms left once the simulators' change is taken out")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", type=Path, nargs="+",
                   help="study or fidelity run directories of the same workload: A (the reference) and B")
    p.add_argument("--pool", action="store_true",
                   help="judge the simulator against all the paths' real runs pooled instead")
    p.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)
    if not args.pool and len(args.paths) != 2:
        p.error(f"give two paths, A and B (got {len(args.paths)}), or --pool")
    try:
        res = pooled(args.paths) if args.pool else judge(*args.paths)
    except (RunMismatch, FileNotFoundError) as e:
        print(f"real_vs_real: {e}", file=sys.stderr)
        return 2
    print(pooled_table(res) if args.pool else report_table(res))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
