"""Where `simulate validate`'s TTFT error comes from, on development rows (docs/validate-accuracy.md,
"TTFT under aic: the structure on the development rows").

    python experiments/ttft_structure.py DIR/validation.csv
    python experiments/ttft_structure.py --breakdown DIR/validation.csv [--before OLD/validation.csv]

Reads a validation.csv of development rows (held-out rows are refused) and prints, per engine, for
the aggregated rows: the signed and absolute TTFT error and the median `gap` (measured TTFT less the
simulated engine's TTFT, what the front-end constant covers) by ISL and by concurrency; the gap in
measured TPOTs of the TensorRT-LLM rows an InferenceX recipe wait applies to; and the front-end
latency (plus k x predicted TPOT; k = 1 is one extra step for an overlap scheduler) refitted on a 5 ms grid with each development model left out.

--breakdown: every priced row, aggregated and disaggregated: TTFT signed and absolute error (and TPOT's
absolute error) by engine x mode, concurrency, ISL/OSL and harness; the 4-client aggregated rows' measured
over simulated engine TTFT (a constant gap is the front end, a constant ratio is the prefill price); with
--before, the same rows' cells before a change beside them.

--sglang-recipe: SGLang's InferenceX DeepSeek-R1 rows with the first token held as their recipes' flags
hold it (SGLang streams a request's output when its token count is a multiple of --stream-interval, and
reads new requests every --scheduler-recv-interval iterations): engine TTFT + ((stream interval - 1) +
(recv interval - 1) / 2) x predicted TPOT, against the front-end constant; a what-if, not the run.
(Superseded: SGLang 0.5.x sends the first token at once whatever the stream interval, and the receive
poll now runs in the row studies: sim/validate_recipes.py, docs/validate-accuracy.md 2026-12-05 10:00.)

--frontend-refit: every priced row (aggregated and disaggregated) of each engine: the median |TTFT error|
with FRONTEND_LATENCY_S as set, the latency minimising it in sample (5 ms grid), and the same fit with
each development model left out (the left-out model's rows priced with the others' latency); --models
M1,M2 and --agg keep only those models' / the aggregated rows.
"""

from __future__ import annotations

import argparse
import re
import sys

import numpy as np
import pandas as pd

from twinserve.sim.validate_engines import FRONTEND_LATENCY_S
from twinserve.sim.validate_rows import DEV_MODELS

GRID_MS = np.arange(0, 400, 5)


def load(path: str) -> pd.DataFrame:
    """The aggregated, priced development rows of a validation.csv."""
    d = pd.read_csv(path)
    if not d["model"].isin(DEV_MODELS).all():
        raise SystemExit("held-out rows in the file: this script reads development rows only")
    d = d[d["expressible"] & d["err_ttft"].notna() & (d["mode"] == "agg")].copy()
    d["gap_ms"] = d["meas_ttft_ms"] - d["pred_ttft_engine_ms"]
    d["tp"] = d["parallelism"].str.extract(r"tp(\d+)", expand=False).astype(int)
    d["isl_bin"] = np.where(d["isl"] <= 1100, "1k", np.where(d["isl"] <= 4100, "2-4k", "8k"))
    d["conc_bin"] = pd.cut(d["concurrency"], [0, 4, 16, 64, 1 << 20], labels=["<=4", "5-16", "17-64", ">64"])
    return d


def _summary(g: pd.DataFrame) -> pd.Series:
    return pd.Series({"rows": len(g), "signed": g["err_ttft"].median(), "abs": g["err_ttft"].abs().median(),
                      "gap_ms": g["gap_ms"].median()})


def _err(g: pd.DataFrame, fe_ms: float, k: float) -> np.ndarray:
    return (g["pred_ttft_engine_ms"] + fe_ms + k * g["pred_tpot_ms"]) / g["meas_ttft_ms"] - 1


def _best(g: pd.DataFrame, k: float) -> float:
    return float(GRID_MS[np.argmin([np.median(np.abs(_err(g, f, k))) for f in GRID_MS])])


def leave_one_model_out(g: pd.DataFrame, k: float) -> tuple[float, list[str]]:
    """Median |error| over every model's rows, each priced with the latency fitted without that model."""
    errs: list[float] = []
    notes = []
    for m in sorted(g["model"].unique()):
        train, test = g[g["model"] != m], g[g["model"] == m]
        if train.empty:
            continue
        f = _best(train, k)
        e = _err(test, f, k)
        errs += list(e)
        notes.append(f"{m} {f:.0f} ms {np.median(np.abs(e)):.1%}")
    return (float(np.median(np.abs(errs))) if errs else float("nan")), notes


def recipe_wait_rows(d: pd.DataFrame) -> pd.Series:
    """TensorRT-LLM Llama-3.1-70B InferenceX rows at ISL 1024 / OSL 1024, TP < 8: the recipe
    (InferenceX benchmarks/70b_fp8_h200_trt_slurm.sh) sets batch_wait_timeout_iters 20."""
    return ((d["backend"] == "trtllm") & (d["model"] == "Llama-3.1-70B") & (d["harness"] == "inferencex")
            & (d["isl"] == 1024) & (d["osl"] == 1024) & (d["tp"] < 8))


def load_all(path: str) -> pd.DataFrame:
    """Every priced development row of a validation.csv (aggregated and disaggregated), with bins."""
    d = pd.read_csv(path)
    if not d["model"].isin(DEV_MODELS).all():
        raise SystemExit("held-out rows in the file: this script reads development rows only")
    d = d[d["expressible"] & d["err_ttft"].notna()].copy()
    d["conc_bin"] = pd.cut(d["concurrency"], [0, 4, 16, 64, 1 << 20], labels=["c<=4", "c5-16", "c17-64", "c>64"])
    d["io"] = np.where(d["isl"] >= 4 * d["osl"], "prefill-heavy", np.where(d["osl"] >= 4 * d["isl"], "decode-heavy",
                                                                          "balanced"))
    return d


def _cell(g: pd.DataFrame) -> pd.Series:
    return pd.Series({"rows": len(g), "ttft_signed": g["err_ttft"].median(), "ttft_abs": g["err_ttft"].abs().median(),
                      "ttft_w20": (g["err_ttft"].abs() <= 0.2).mean(), "tpot_abs": g["err_tpot"].abs().median()})


def breakdown(path: str, before: str | None) -> None:
    """The --breakdown tables (see the module docstring)."""
    d = load_all(path)
    old = load_all(before) if before else None
    if old is not None:
        old = old[old["row_id"].isin(d["row_id"])]
        d = d[d["row_id"].isin(old["row_id"])]
    print("all rows:", _cell(d).round(3).to_dict())
    if old is not None:
        print("before:  ", _cell(old).round(3).to_dict())
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    for by in (["backend", "mode"], ["backend", "mode", "conc_bin"], ["backend", "io"], ["harness", "backend"]):
        t = d.groupby(by, observed=True)[list(d.columns)].apply(_cell)
        if old is not None:  # the cells before, beside: ttft_signed_b etc.
            b = old.groupby(by, observed=True)[list(old.columns)].apply(_cell).drop(columns="rows")
            t = t.join(b.add_suffix("_b"))
        print(t.round(3).to_string(), "\n")
    a = d[(d["mode"] == "agg") & (d["concurrency"] <= 4)].copy()
    a["gap_ms"] = a["meas_ttft_ms"] - a["pred_ttft_engine_ms"]
    a["ratio"] = a["meas_ttft_ms"] / a["pred_ttft_engine_ms"]
    print("4-client aggregated rows: measured TTFT - engine TTFT (gap) and measured / engine (ratio), medians")
    print(a.groupby(["backend", "model", "system"])[["gap_ms", "ratio"]].median().round(2))


def _sglang_recipe(r: pd.Series) -> tuple[int, int]:
    """(stream interval, scheduler recv interval) of InferenceX's SGLang DeepSeek-R1 recipes
    (benchmarks/dsr1_fp8_h200.sh, dsr1_fp8_b200.sh, dsr1_fp4_b200.sh); (1, 1) where none is known."""
    tp = int(re.search(r"tp(\d+)", str(r["parallelism"])).group(1))
    if r["system"] == "h200_sxm" and r["precision"] == "fp8":
        return 10, 1
    if r["system"] == "b200_sxm" and r["precision"] == "fp8":
        return 30, 10 if (tp != 8 or r["concurrency"] < 16) else 30
    if r["system"] == "b200_sxm" and r["precision"] == "fp4":
        return 10, 10 if r["concurrency"] < 16 else 30
    return 1, 1


def sglang_recipe(path: str) -> None:
    """The --sglang-recipe what-if (see the module docstring)."""
    d = load_all(path)
    d = d[(d["backend"] == "sglang") & (d["mode"] == "agg") & (d["harness"] == "inferencex")].copy()
    flags = d.apply(_sglang_recipe, axis=1, result_type="expand")
    d["hold_ms"] = ((flags[0] - 1) + (flags[1] - 1) / 2) * d["pred_tpot_ms"]
    for fe in (0, 100, 300):
        e0 = (d["pred_ttft_engine_ms"] + fe) / d["meas_ttft_ms"] - 1
        e1 = (d["pred_ttft_engine_ms"] + fe + d["hold_ms"]) / d["meas_ttft_ms"] - 1
        print(f"{len(d)} rows, front end {fe} ms: as run {e0.abs().median():.1%} ({e0.median():+.0%}); "
              f"first token held by the recipe {e1.abs().median():.1%} ({e1.median():+.0%})")


def frontend_refit(path: str, models: list[str] | None = None, agg_only: bool = False) -> None:
    """The --frontend-refit table (see the module docstring); models / agg_only: only those rows."""
    d = load_all(path)
    if models:
        d = d[d["model"].isin(models)]
    if agg_only:
        d = d[d["mode"] == "agg"]
    for backend, g in d.groupby("backend"):
        now = np.median(np.abs(_err(g, 1000 * FRONTEND_LATENCY_S.get(str(backend), 0.0), 0)))
        best = _best(g, 0)
        lomo, notes = leave_one_model_out(g, 0)
        print(f"{backend} ({len(g)} rows: {', '.join(f'{m} {n}' for m, n in g['model'].value_counts().items())}): "
              f"as set {1000 * FRONTEND_LATENCY_S.get(str(backend), 0.0):.0f} ms {now:.1%}; 0 ms "
              f"{np.median(np.abs(_err(g, 0, 0))):.1%}; in sample {best:.0f} ms "
              f"{np.median(np.abs(_err(g, best, 0))):.1%}; each model left out {lomo:.1%}: {', '.join(notes)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("validation", help="a validation.csv of `simulate validate --rows dev`")
    p.add_argument("--breakdown", action="store_true", help="every priced row's error by engine, mode, clients, ISL/OSL")
    p.add_argument("--before", help="with --breakdown: the same rows' validation.csv before a change")
    p.add_argument("--sglang-recipe", action="store_true", help="SGLang rows with their recipes' first-token hold")
    p.add_argument("--frontend-refit", action="store_true", help="FRONTEND_LATENCY_S refitted per engine, "
                   "each development model left out")
    p.add_argument("--models", help="with --frontend-refit: only these development models' rows (comma-separated)")
    p.add_argument("--agg", action="store_true", help="with --frontend-refit: aggregated rows only")
    args = p.parse_args(argv)
    if args.frontend_refit:
        frontend_refit(args.validation, args.models.split(",") if args.models else None, args.agg)
        return 0
    if args.sglang_recipe:
        sglang_recipe(args.validation)
        return 0
    if args.breakdown:
        breakdown(args.validation, args.before)
        return 0
    d = load(args.validation)
    pd.set_option("display.width", 200)
    for by in ("isl_bin", "conc_bin"):
        print(d.groupby(["backend", by], observed=True)[["err_ttft", "gap_ms"]].apply(_summary).round(3), "\n")
    w = d[recipe_wait_rows(d)]
    print("recipe-wait rows: gap / measured TPOT =", (w["gap_ms"] / w["meas_tpot_ms"]).round(1).tolist())
    rest = d[(d["backend"] == "trtllm") & (d["model"] == "Llama-3.1-70B") & ~recipe_wait_rows(d)]
    print("other TensorRT-LLM Llama rows: gap / measured TPOT, median",
          round(float((rest["gap_ms"] / rest["meas_tpot_ms"]).median()), 1), "\n")
    for backend, g in d.groupby("backend"):
        now = np.median(np.abs(_err(g, 1000 * FRONTEND_LATENCY_S.get(str(backend), 0.0), 0)))
        for k in (0, 1, 2):
            lomo, notes = leave_one_model_out(g, k)
            print(f"{backend} ({len(g)} rows) k={k}: now {now:.1%}; in sample {_best(g, k):.0f} ms; "
                  f"each model left out {lomo:.1%}: {', '.join(notes)}")
    # TensorRT-LLM without the rows a recipe wait explains (DeepSeek-R1's MTP / attention-DP balance,
    # the three batch-wait rows): what the front end alone looks like.
    t = d[(d["backend"] == "trtllm") & (d["model"] != "DeepSeek-R1") & ~recipe_wait_rows(d)]
    lomo, notes = leave_one_model_out(t, 0)
    print(f"trtllm without recipe-wait rows ({len(t)} rows): 100 ms {np.median(np.abs(_err(t, 100, 0))):.1%}; "
          f"in sample {_best(t, 0):.0f} ms {np.median(np.abs(_err(t, _best(t, 0), 0))):.1%}; "
          f"each model left out {lomo:.1%}: {', '.join(notes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
