"""The simulator's tensor-parallel arithmetic, checked against the real engine's steps.

The simulator prices a TP step as the TP 1 step's device work split over the ranks plus
the all-reduces (two per layer, a latency plus a cost per byte) while the engine's CPU
overhead (schedule, update, outputs) stays whole. This script takes calibration step
logs (`twinserve calibrate --tensor-parallel-size 1 / 2`, run interleaved: TP 1, TP 2,
TP 1, TP 2, so the machine's speed drift hits both sizes alike), fits the TP 1 profile,
fits the all-reduce cost from the TP 2 log's measured communication time (a per-step
latency and a per-token cost), predicts every TP 2 step from them, and prints the error
by step kind next to the error of a profile fitted on the TP 2 steps themselves (what a
per-TP calibration gets).

    twinserve calibrate --tensor-parallel-size 1 --out tp1.json     # then TP 2, TP 1, TP 2
    python experiments/tp_check.py --tp1 tp1.steps.csv [...] --tp2 tp2.steps.csv [...]
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import numpy as np

from twinserve.backends.real.step_log import read_step_log
from twinserve.backends.sim.fit import _nnls, fit_step_profile, step_kind
from twinserve.backends.sim.fitted import FEATURE_COLUMNS, FittedCostModel


def _features(row: dict[str, Any]) -> list[float]:
    return [float(row[c]) for c in FEATURE_COLUMNS]


def _measured(row: dict[str, Any]) -> float:
    # What the fit treats as the step's cost: the step plus the driver's gap before the next.
    return float(row["step_time_s"]) + float(row.get("gap_s") or 0.0)


def _comm(row: dict[str, Any]) -> float:
    return float((row.get("extra") or {}).get("comm_time_s", 0.0))


def _computed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if float(r["num_prefill_tokens"]) + float(r["num_decode_seqs"]) > 0]


def fit_allreduce(rows: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(seconds per step, seconds per token) of the measured all-reduce time, least squares >= 0."""
    tokens = np.array([float(r["num_prefill_tokens"]) + float(r["num_decode_seqs"]) for r in rows])
    comm = np.array([_comm(r) for r in rows])
    x = np.stack([np.ones_like(tokens), tokens], axis=1)
    coef = _nnls(x, comm, np.ones_like(comm))
    return float(coef[0]), float(coef[1])


def predict_tp(tp1: FittedCostModel, tp: int, comm_step_s: float, comm_token_s: float,
               row: dict[str, Any]) -> float:
    """A step at tensor-parallel size tp from the TP 1 profile: device part / tp, overhead whole."""
    f = _features(row)
    device, overhead = tp1.split(*f)
    tokens = f[0] + f[4]
    return device / tp + overhead + comm_step_s + comm_token_s * tokens


def _summary(errors: dict[str, list[float]]) -> str:
    cells = []
    for kind in ("prefill", "decode", "mixed", "all"):
        e = np.array(errors.get(kind, []))
        if len(e):
            cells.append(f"{kind}: median {np.median(e):+.1%}, MAPE {np.mean(np.abs(e)):.1%} "
                         f"(n={len(e)})")
    return "; ".join(cells)


def main(argv: list[str] | None = None) -> None:
    """Fit, predict and print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp1", nargs="+", required=True, help="TP 1 calibration step logs")
    ap.add_argument("--tp2", nargs="+", required=True, help="TP 2 calibration step logs")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel size of the --tp2 logs")
    args = ap.parse_args(argv)
    rows1 = _computed([r for p in args.tp1 for r in read_step_log(p)])
    rows2 = _computed([r for p in args.tp2 for r in read_step_log(p)])
    tp1 = fit_step_profile(rows1)
    own = fit_step_profile(rows2)
    comm_step, comm_token = fit_allreduce(rows2)
    comm_total = sum(_comm(r) for r in rows2)
    print(f"TP 1: {len(rows1)} steps from {len(args.tp1)} log(s); TP {args.tp}: {len(rows2)} steps "
          f"from {len(args.tp2)} log(s)")
    print(f"measured all-reduce time: {comm_total / sum(_measured(r) for r in rows2):.1%} of TP "
          f"{args.tp} step time; fitted {comm_step * 1e3:.2f} ms per step + "
          f"{comm_token * 1e6:.1f} us per token")
    pred_err: dict[str, list[float]] = {}
    own_err: dict[str, list[float]] = {}
    split_err: dict[str, list[float]] = {}
    ratio: dict[str, list[float]] = {}
    for r in rows2:
        m = _measured(r)
        kind = step_kind(float(r["num_prefill_tokens"]), float(r["num_decode_seqs"]))
        p = predict_tp(tp1, args.tp, comm_step, comm_token, r)
        o = own.step_time(*_features(r))
        f = _features(r)
        device1, _ = tp1.split(*f)
        # The device work without its communication, against TP 1's device work / tp.
        compute = float(r.get("execute_s") or 0.0) - _comm(r)
        for bucket in (kind, "all"):
            pred_err.setdefault(bucket, []).append(p / m - 1)
            own_err.setdefault(bucket, []).append(o / m - 1)
            if device1 > 0 and compute > 0:
                split_err.setdefault(bucket, []).append((device1 / args.tp) / compute - 1)
            ratio.setdefault(bucket, []).append(tp1.step_time(*f) / m)
    print(f"TP {args.tp} steps predicted from the TP 1 profile (device / {args.tp} + overhead + "
          f"all-reduce), signed error predicted vs measured:")
    print(f"  {_summary(pred_err)}")
    print(f"the same steps from a profile fitted on the TP {args.tp} steps themselves:")
    print(f"  {_summary(own_err)}")
    print(f"device work without communication, TP 1 / {args.tp} vs measured at TP {args.tp}:")
    print(f"  {_summary(split_err)}")
    speedups = "; ".join(f"{k} {np.median(v):.2f}x" for k, v in ratio.items())
    print(f"measured speedup of TP {args.tp} over TP 1 (TP 1 profile / TP {args.tp} step), median: "
          f"{speedups}")


if __name__ == "__main__":
    main()
