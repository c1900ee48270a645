"""Fit the serving terms aic's kernel timings leave out (host time per step and per sequence, a kernel
scale) on development rows, per engine, with leave-one-model-out checks (docs/validate-accuracy.md).

    python experiments/aic_serving_fit.py probe --out probe.csv [--limit N]      # kernel-only mean field
    python experiments/aic_serving_fit.py fit --probe probe.csv                   # fits + leave-one-model-out
    python experiments/aic_serving_fit.py fit --validation DIR/validation.csv --host-step-ms 0.8 \
        --host-seq-us 10 --host-backends vllm,sglang                               # on simulated rows

`probe` prices every aggregated development row (the issue's development models only; held-out rows
are refused) with `--cost-model aic` and no host time, as experiments/step_probe.py's mean-field
closed loop does: `k_ms` is the kernel-only TPOT, `b` the sequences in a decode step. `fit` models the
measured TPOT per engine as

    meas = s * k + h + p * b      (s: kernel scale, h: host seconds a step, p: a sequence)

under a few nested forms, each fitted by least absolute relative error (the median |error| the issue
judges), and scores each form on the rows of a model left out of its fit. From a validation.csv the
kernel-only TPOT is pred_tpot_ms less the host time that run added (--host-*), and b the clients.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings

import numpy as np
import pandas as pd

FORMS = {  # name -> which of (s, h, p) are free; fixed values otherwise s = 1, h = p = 0
    "kernel": (), "h": ("h",), "h+p": ("h", "p"), "s": ("s",), "s+h": ("s", "h"), "s+h+p": ("s", "h", "p"),
}


def probe(limit: int, out: str) -> None:
    """Kernel-only mean-field TPOT of each aggregated development row (step_probe's closed loop)."""
    sys.path.insert(0, "experiments")
    import logging

    import step_probe  # type: ignore[import-not-found]

    from twinserve.backends.sim.aic.cost_model import ServingTerms
    from twinserve.sim import validate_rows
    from twinserve.sim.validate_rows import _resolve_model, load_rows
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    validate_rows.aic_serving_terms = lambda backend: ServingTerms()  # kernels only: the fit adds the terms
    build, cache = step_probe.build_cost_models, {}

    def cached(cfg):  # one cost model per engine table (the rows share a few dozen)
        key = (repr(cfg.engine), repr(cfg.custom_model))
        if key not in cache:
            cache[key] = build(cfg)
        return cache[key]

    step_probe.build_cost_models = cached
    rows = load_rows()
    rows = rows[(rows["split"] == "dev") & (rows["mode"] == "agg")]
    if limit and len(rows) > limit:
        rows = rows.iloc[np.unique(np.linspace(0, len(rows) - 1, limit).round().astype(int))]
    recs = []
    for i, (_, r) in enumerate(rows.iterrows()):
        rec = {k: r[k] for k in ("id", "model", "backend", "system", "isl", "osl", "concurrency",
                                 "silicon_tpot_ms", "silicon_ttft_ms")}
        try:
            p = step_probe.probe_row(r, "aic")
            rec.update(k_ms=p["pred_tpot_ms"], decode_ms=p["pred_decode_ms"])
            rec["layers"] = _resolve_model(r["model"], r["model_path"]).num_layers
        except Exception as e:  # not expressible or not priced
            rec["why"] = f"{type(e).__name__}: {str(e)[:100]}"
        recs.append(rec)
        if i % 100 == 0:
            print(f"{i}/{len(rows)}", file=sys.stderr, flush=True)
    d = pd.DataFrame(recs)
    d["b"] = d["concurrency"]  # aggregated rows: one engine holds every client (attention DP: all ranks)
    d.to_csv(out, index=False)
    print(f"{len(d)} rows, {d['k_ms'].notna().sum()} priced -> {out}")


def design(d: pd.DataFrame, free: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A, y with A @ theta - y = the relative error's numerator part for the free parameters."""
    m, k, b = d["meas"].to_numpy(), d["k"].to_numpy(), d["b"].to_numpy()
    cols = {"s": k / m, "h": 1.0 / m, "p": b / m}
    fixed = (0.0 if "s" in free else k / m)  # s fixed at 1: k/m moves to the constant side
    a = np.column_stack([cols[f] for f in free]) if free else np.zeros((len(d), 0))
    return a, np.ones(len(d)) - fixed


def lad(d: pd.DataFrame, free: tuple[str, ...]) -> dict[str, float]:
    """theta minimising sum |pred / meas - 1| (h, p >= 0; s in [0.5, 3]) by linear programming."""
    from scipy.optimize import linprog
    theta = {"s": 1.0, "h": 0.0, "p": 0.0}
    if not free:
        return theta
    a, y = design(d, free)
    n, q = a.shape
    # variables: theta (q), u+ (n), u- (n); a theta - y = u+ - u-; minimise sum u+ + u-
    c = np.concatenate([np.zeros(q), np.ones(2 * n)])
    a_eq = np.hstack([a, -np.eye(n), np.eye(n)])
    bounds = [(0.5, 3.0) if f == "s" else (0.0, 0.05) for f in free] + [(0, None)] * (2 * n)
    res = linprog(c, A_eq=a_eq, b_eq=y, bounds=bounds, method="highs")
    if not res.success:
        raise RuntimeError(res.message)
    theta.update(dict(zip(free, res.x[:q])))
    return theta


def predict(d: pd.DataFrame, t: dict[str, float]) -> np.ndarray:
    return t["s"] * d["k"].to_numpy() + t["h"] + t["p"] * d["b"].to_numpy()


def score(err: np.ndarray) -> str:
    a = np.abs(err)
    return f"{np.median(a):6.1%} ({np.median(err):+5.0%}, {np.mean(a <= 0.2):4.0%})"


def fit(d: pd.DataFrame) -> None:
    """Each form per engine: in-sample fit and leave-one-model-out score."""
    for backend, g in d.groupby("backend"):
        models = sorted(g["model"].unique())
        print(f"\n## {backend}: {len(g)} rows, models {', '.join(f'{m} ({(g.model == m).sum()})' for m in models)}")
        print(f"{'form':<7} {'s':>5} {'h ms':>6} {'p us':>6}   in-sample           "
              "leave-one-model-out   per model left out")
        for name, free in FORMS.items():
            t = lad(g, free)
            err_in = predict(g, t) / g["meas"].to_numpy() - 1
            loo = np.full(len(g), np.nan)
            per = []
            for m in models:
                out = (g["model"] == m).to_numpy()
                if out.all() or (~out).sum() < 3:
                    continue
                tm = lad(g[~out], free)
                loo[out] = predict(g[out], tm) / g[out]["meas"].to_numpy() - 1
                per.append(f"{m.split('-')[0]}:{np.median(np.abs(loo[out])):.0%}"
                           f"(s{tm['s']:.2f},h{tm['h'] * 1e3:.2f},p{tm['p'] * 1e6:.0f})")
            ok = ~np.isnan(loo)
            print(f"{name:<7} {t['s']:5.2f} {t['h'] * 1e3:6.2f} {t['p'] * 1e6:6.1f}   {score(err_in)}   "
                  f"{score(loo[ok]) if ok.any() else '-':<20}  {' '.join(per)}")


def front_end(d: pd.DataFrame, grid_ms: float = 10.0, top_ms: float = 1000.0) -> None:
    """The front-end latency per engine minimising the median |TTFT error| (engine TTFT + latency), on a
    grid, in sample and leaving one model out (sim/validate_engines.py's fit, on these rows)."""
    grid = np.arange(0.0, top_ms + grid_ms / 2, grid_ms)

    def best(g: pd.DataFrame) -> float:
        eng, meas = g["pred_ttft_engine_ms"].to_numpy(), g["meas_ttft_ms"].to_numpy()
        return float(grid[np.argmin([np.median(np.abs((eng + f) / meas - 1)) for f in grid])])

    for backend, g in d.groupby("backend"):
        g = g[g["pred_ttft_engine_ms"].notna()]
        f = best(g)
        now = g["pred_ttft_ms"] - g["pred_ttft_engine_ms"]
        err_now = (g["pred_ttft_ms"] / g["meas_ttft_ms"] - 1).to_numpy()
        err_fit = ((g["pred_ttft_engine_ms"] + f) / g["meas_ttft_ms"] - 1).to_numpy()
        loo, per = np.full(len(g), np.nan), []
        for m in sorted(g["model"].unique()):
            out = (g["model"] == m).to_numpy()
            if (~out).sum() < 3:
                continue
            fm = best(g[~out])
            loo[out] = ((g[out]["pred_ttft_engine_ms"] + fm) / g[out]["meas_ttft_ms"] - 1).to_numpy()
            per.append(f"{m.split('-')[0]}:{np.median(np.abs(loo[out])):.0%}({fm:.0f} ms)")
        ok = ~np.isnan(loo)
        print(f"{backend:<7} {len(g):3d} rows  now {now.median():5.0f} ms {score(err_now)}  fitted {f:5.0f} ms "
              f"{score(err_fit)}  leave-one-model-out {score(loo[ok]) if ok.any() else '-'}  {' '.join(per)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="kernel-only mean-field TPOT of the aggregated development rows")
    p.add_argument("--out", required=True, help="CSV to write")
    p.add_argument("--limit", type=int, default=0, help="at most N rows, spread evenly (0: all)")
    f = sub.add_parser("fit", help="fit the forms per engine and score them leaving one model out")
    f.add_argument("--probe", help="a CSV from `probe`")
    f.add_argument("--validation", help="a validation.csv of `simulate validate --cost-model aic --rows dev`")
    f.add_argument("--host-step-ms", type=float, default=0.0, help="host ms a step that run added")
    f.add_argument("--host-seq-us", type=float, default=0.0, help="host us a sequence that run added")
    f.add_argument("--host-backends", default="", help="the engines it added them to, comma-separated")
    f.add_argument("--decode-only", type=float, default=0.0, metavar="R",
                   help="probe: only rows with ISL / OSL <= R, priced by their pure decode step (no prefill)")
    f.add_argument("--ttft", action="store_true",
                   help="--validation: fit the front-end latency per engine on TTFT instead (all modes)")
    f.add_argument("--by", default="", help="also fit within each value of this column (e.g. system)")
    args = ap.parse_args()
    if args.cmd == "probe":
        probe(args.limit, args.out)
        return 0
    if args.probe:
        d = pd.read_csv(args.probe)
        d = d[d["k_ms"].notna()].copy()
        d["k"], d["meas"] = d["k_ms"] / 1e3, d["silicon_tpot_ms"] / 1e3
        if args.decode_only:
            d = d[d["isl"] <= args.decode_only * d["osl"]].copy()
            d["k"] = d["decode_ms"] / 1e3
    else:
        d = pd.read_csv(args.validation)
        if (d["split"] != "dev").any():
            raise SystemExit("fit: held-out rows in the file; fit on development rows only")
        if args.ttft:
            front_end(d[d["pred_ttft_ms"].notna()])
            for key, g in d[d["pred_ttft_ms"].notna()].groupby(args.by) if args.by else []:
                print(f"# {args.by} = {key}")
                front_end(g)
            return 0
        d = d[d["pred_tpot_ms"].notna() & (d["mode"] == "agg")].copy()
        host = set(filter(None, args.host_backends.split(",")))
        added = (args.host_step_ms * 1e-3 + args.host_seq_us * 1e-6 * d["concurrency"]) * d["backend"].isin(host)
        d["k"] = d["pred_tpot_ms"] / 1e3 - added
        d["meas"], d["b"] = d["meas_tpot_ms"] / 1e3, d["concurrency"]
    if "split" in d and (d["split"] != "dev").any():
        raise SystemExit("fit: held-out rows in the file; fit on development rows only")
    fit(d)
    if args.by:
        for key, g in d.groupby(args.by):
            print(f"\n# {args.by} = {key}")
            fit(g)
    return 0


if __name__ == "__main__":
    sys.exit(main())
