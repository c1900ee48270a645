"""A mean-field TPOT/TTFT per silicon row from one cost model's step prices: fast error buckets.

    python experiments/step_probe.py [--rows dev|heldout] [--cost-model roofline|aic] [--limit N]
        [--by backend] [--by system] [--by moe,backend] [--csv OUT]

No simulation: each aggregated row (or a disaggregated row's decode worker) is priced as a steady
closed loop of N clients, mean lengths as the row's benchmark draws them. A decode step carries the
N clients' tokens plus the prefill tokens a cycle needs spread over its OSL steps (N x ISL / OSL a
step, vLLM's and TensorRT-LLM's mixed steps); past the step budget the surplus runs as
budget-sized prefill steps. TTFT: one prefill of ISL beside the decodes, plus the front-end
latency (sim/validate_engines.py). It is the planner's estimate (aiconfigurator's run_agg is one
too), used here to find which buckets a step-cost change moves before a `simulate validate` run
checks it. The rows come from the installed aiconfigurator-core, never copied.
"""

from __future__ import annotations

import argparse
import math
import warnings

import pandas as pd

from twinserve.sim.build import build_cost_models
from twinserve.sim.validate_engines import frontend_latency_s
from twinserve.sim.validate_protocol import run_design
from twinserve.sim.validate_rows import load_rows, row_plan


def probe_row(row: pd.Series, cost_model: str) -> dict:
    """Predicted TPOT and TTFT (ms) of one row, or a reason."""
    plan = row_plan(row, cost_model)
    cfg = plan.cfg
    c = cfg.cluster
    n = int(row["concurrency"])
    if c.replicas:  # disaggregated: the decode workers' share of the clients, and no prefill in decode steps
        workers = c.num_replicas - c.num_prefill_replicas
        for k, v in c.replicas[-1].items():
            sec, name = k.split(".", 1)
            setattr(getattr(cfg, sec), name, v)
    else:
        workers = max(1, c.num_replicas)
    _, _, _, cost = build_cost_models(cfg)
    design = run_design(row, "benchmark")
    (p_lo, p_hi), (o_lo, o_hi) = design.lengths(int(row["isl"])), design.lengths(int(row["osl"]))
    isl, osl = (p_lo + p_hi) / 2, max(2.0, (o_lo + o_hi) / 2)
    b = max(1, math.ceil(n / workers))
    budget = cfg.scheduler.max_num_batched_tokens
    ctx = int(b * (isl + osl / 2))
    decode = cost.step_time(0, 0, 0, 0.0, b, ctx)
    if c.replicas:
        tpot = decode
    else:
        per_step = b * isl / osl  # prefill tokens a decode step carries in a steady loop
        room = max(0.0, budget - b)
        mixed_p = min(per_step, room)
        seqs = max(1, round(mixed_p / isl)) if mixed_p else 0
        mixed = cost.step_time(int(mixed_p), seqs, 0, mixed_p * isl / 2 / max(seqs, 1), b, ctx) if mixed_p else decode
        surplus = (per_step - mixed_p) * osl  # prefill tokens left for prefill-only steps
        extra = 0.0
        if surplus > 0:
            full = cost.step_time(budget, max(1, round(budget / isl)), 0, budget * isl / 2, 0, 0)
            extra = surplus / budget * full
        tpot = mixed + extra / osl
    chunk = int(min(isl, budget))
    ttft = cost.step_time(chunk, 1, 0, chunk * chunk / 2, max(0, b - 1), int((b - 1) * (isl + osl / 2)))
    ttft *= math.ceil(isl / budget)
    ttft += frontend_latency_s(str(row["backend"]), int(row["isl"]))
    return {"pred_tpot_ms": tpot * 1e3, "pred_ttft_ms": ttft * 1e3, "pred_decode_ms": decode * 1e3,
            "layout": plan.layout}


def buckets(d: pd.DataFrame) -> pd.DataFrame:
    """Columns to group errors by: dense/MoE, agg/disagg, prefill- or decode-heavy, error sign."""
    from twinserve.sim.validate_rows import _resolve_model
    moe = {m: _resolve_model(m, p).is_moe for m, p in d[["model", "model_path"]].drop_duplicates().values}
    d["moe"] = d["model"].map(moe).map({True: "moe", False: "dense"})
    d["heavy"] = (d["isl"] / d["osl"]).map(lambda r: "prefill" if r >= 4 else "decode" if r <= 0.5 else "mid")
    d["conc"] = pd.cut(d["concurrency"], [0, 8, 32, 128, 1e9], labels=["<=8", "9-32", "33-128", ">128"])
    return d


def stats(e: pd.Series) -> str:
    """median |err| (median signed, share within 20%) n."""
    e = e.dropna()
    if e.empty:
        return "-"
    return f"{e.abs().median():6.1%} ({e.median():+5.0%}, {(e.abs() <= 0.2).mean():4.0%}) n={len(e)}"


def main() -> None:
    """Probe the rows and print the error per bucket."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="dev", choices=["dev", "heldout", "all"], help="which split")
    ap.add_argument("--cost-model", default="roofline", help="roofline or aic")
    ap.add_argument("--limit", type=int, default=0, help="at most N rows, spread evenly (0: all)")
    ap.add_argument("--by", action="append", default=None, help="group columns, comma-separated")
    ap.add_argument("--model", default="", help="only this model")
    ap.add_argument("--mode", default="", help="only agg or disagg rows")
    ap.add_argument("--csv", default="", help="write the per-row table here")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import logging
    logging.disable(logging.WARNING)
    rows = load_rows()
    if args.rows != "all":
        rows = rows[rows["split"] == args.rows]
    if args.model:
        rows = rows[rows["model"] == args.model]
    if args.mode:
        rows = rows[rows["mode"] == args.mode]
    if args.limit and len(rows) > args.limit:
        rows = rows.iloc[[round(i * len(rows) / args.limit) for i in range(args.limit)]]
    out = []
    for _, r in rows.iterrows():
        rec = {k: r[k] for k in ("id", "model", "model_path", "backend", "system", "mode", "isl", "osl",
                                 "concurrency", "silicon_tpot_ms", "silicon_ttft_ms")}
        try:
            rec.update(probe_row(r, args.cost_model))
        except Exception as e:  # not expressible or not priced: counted apart
            rec["why"] = f"{type(e).__name__}: {str(e)[:80]}"
        out.append(rec)
    d = pd.DataFrame(out)
    if "pred_tpot_ms" not in d:
        print(f"{len(d)} rows, none priced ({args.cost_model}, {args.rows})")
        return
    ok = d[d["pred_tpot_ms"].notna()].copy()
    print(f"{len(d)} rows, {len(ok)} priced ({args.cost_model}, {args.rows})")
    ok["err_tpot"] = ok["pred_tpot_ms"] / ok["silicon_tpot_ms"] - 1
    ok["err_ttft"] = ok["pred_ttft_ms"] / ok["silicon_ttft_ms"] - 1
    ok = buckets(ok)
    if args.csv:
        ok.to_csv(args.csv, index=False)
    print(f"{'all':<40} TPOT {stats(ok['err_tpot'])}   TTFT {stats(ok['err_ttft'])}")
    for by in args.by or ["backend", "system", "moe", "mode", "heavy", "conc", "model"]:
        cols = by.split(",")
        for key, g in ok.groupby(cols, observed=True):
            key = key if isinstance(key, tuple) else (key,)
            label = by + "=" + "/".join(str(k) for k in key)
            print(f"{label:<40} TPOT {stats(g['err_tpot'])}   TTFT {stats(g['err_ttft'])}")


if __name__ == "__main__":
    main()
