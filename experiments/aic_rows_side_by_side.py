"""AIConfigurator's own TTFT/TPOT estimate and twinserve's, on the same silicon rows.

    python experiments/aic_rows_side_by_side.py --csv DIR/validation.csv [--tails] [--ctx-tokens 8192]
    python experiments/aic_rows_side_by_side.py --limit 20 --backend vllm [--tails]   # runs validate first

AIConfigurator's estimate is aiconfigurator-core 0.12's highest-level public call that answers
TTFT and TPOT for a fixed concurrency: `BaseBackend.run_agg(model, database, RuntimeConfig(
batch_size=N, isl, osl), ctx_tokens=C)` (sdk/backends/base_backend.py), the mean-field
continuous-batching estimate its agg planner sweeps; it is built from the same per-iteration
`MixedStepInput` steps as sdk/step_estimate.py. The planner sweeps C; here C is fixed (default
8192, vLLM's default max_num_batched_tokens for an API server on a large GPU), an assumption
named in the table. Each row is priced from the row's backend database at the row's version where
installed, else the database's current one (as `simulate validate --cost-model aic` does).
Disaggregated rows are not priced (run_agg is the aggregated estimate); rows the SDK refuses
(missing kernel data, unknown model) are counted with the SDK's reason, not crashed.

twinserve's figures are the CSV's (`pred_tpot_ms`; a second CSV via --csv-aic adds the aic cost
model). `simulate validate` reports per-row means only; --tails reruns each row's twinserve study
(the same closed loop and measured window) to read its per-request TPOT p90/p99.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd

DEV = ("Llama-3.1-70B", "Qwen3-32B", "gpt-oss-120b", "DeepSeek-R1")


def _int(v: Any, default: int | None = 1) -> int | None:
    return int(v) if v == v and v is not None else default


def aic_model_path(path: str) -> str:
    """The row's model_path, or the package's name for the same model where it ships only that config."""
    import aiconfigurator_core

    configs = Path(aiconfigurator_core.__file__).parent / "model_configs"
    org, name = path.split("/", 1)
    # The rows say Llama-3.1-*; the package ships Meta-Llama-3.1-* (and no Llama-3.1-8B FP8 checkpoint,
    # whose weights are the 8B's: the row's gemm_quant_mode still sets FP8).
    for cand in (path, f"meta-llama/Meta-{name}", f"meta-llama/Meta-{re.sub(r'-Instruct(-FP8)?$', '', name)}"):
        if (configs / f"{cand.replace('/', '--')}_config.json").exists():
            return cand
    # The same model filed under its maker's newer organisation (zhipuai/GLM-5 -> zai-org/GLM-5).
    same = sorted(configs.glob(f"*--{name}_config.json"))
    return same[0].name[:-len("_config.json")].replace("--", "/", 1) if same else path


def aic_estimate(row: pd.Series, ctx_tokens: int) -> tuple[float, float, str]:
    """(TTFT ms, TPOT ms, '') from AIConfigurator's run_agg, or (nan, nan, reason)."""
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import perf_database as pdb
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator_core.sdk.models import get_model
    from twinserve.backends.sim.aic.mapping import resolve_version

    nan = float("nan")
    if row["mode"] != "agg":
        return nan, nan, "disaggregated: run_agg prices aggregated rows only"
    try:
        try:
            version = resolve_version(row["system"], row["backend"], str(row["backend_version"]))
        except Exception:  # the row's version not installed: the current database, as validate does
            version = resolve_version(row["system"], row["backend"], "")
        db = pdb.get_database(row["system"], row["backend"], version)
        if db is None:
            return nan, nan, f"no {row['backend']} {version} database for {row['system']}"
        moe = row.get("moe_quant_mode")
        gemm = row["gemm_quant_mode"] if isinstance(row["gemm_quant_mode"], str) else "bfloat16"  # no precision: BF16
        mc = ModelConfig(tp_size=_int(row["tp_size"]), pp_size=_int(row["pp_size"]),
                         gemm_quant_mode=common.GEMMQuantMode[gemm],
                         moe_quant_mode=common.MoEQuantMode[moe] if isinstance(moe, str) else None,
                         attention_dp_size=_int(row["attention_dp_size"]),
                         moe_tp_size=_int(row["moe_tp_size"], None), moe_ep_size=_int(row["moe_ep_size"], None))
        model = get_model(aic_model_path(row["model_path"]), mc, row["backend"])
        rc = RuntimeConfig(batch_size=int(row["batch_size"]), isl=int(row["isl"]), osl=int(row["osl"]))
        summ = get_backend(row["backend"]).run_agg(model, db, rc, ctx_tokens=ctx_tokens).get_summary_df()
        return float(summ["ttft"].iloc[0]), float(summ["tpot"].iloc[0]), ""
    except Exception as e:  # the SDK's refusal is the reason this row is not estimated
        return nan, nan, f"{type(e).__name__}: {str(e).splitlines()[0][:110]}"


def twin_tails(row: pd.Series) -> tuple[float, float]:
    """twinserve's per-request TPOT p90, p99 (ms) over the measured window of the row's study."""
    from twinserve.sim.study import run_point
    from twinserve.sim.validate_protocol import DEFAULT_WINDOW, run_design
    from twinserve.sim.validate_rows import closed_loop_available, design_counts, row_study

    if not closed_loop_available():
        return float("nan"), float("nan")
    warm, measured, _ = design_counts(int(row["concurrency"]), run_design(row, DEFAULT_WINDOW))
    req = run_point(row_study(row, "roofline", window=DEFAULT_WINDOW)).requests
    win = req.sort_values(["arrival_s", "request_id"], kind="stable").iloc[warm:warm + measured]["tpot_s"] * 1000
    return float(win.quantile(0.90)), float(win.quantile(0.99))


def stats(errs: list[float]) -> str:
    """'median |err| / share within 20% (n)' of finite signed errors."""
    a = [abs(e) for e in errs if e == e and math.isfinite(e)]
    if not a:
        return "- (0)"
    return f"{median(a):.1%} / {sum(x <= 0.20 for x in a) / len(a):.0%} ({len(a)})"


def main() -> int:
    """Price the rows with AIConfigurator, print the per-row and summary tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", help="validation.csv of `simulate validate` (roofline)")
    ap.add_argument("--csv-aic", help="validation.csv of `simulate validate --cost-model aic`, same rows")
    ap.add_argument("--limit", type=int, default=20, help="without --csv: rows for validate to run")
    ap.add_argument("--backend", default="vllm", help="without --csv: validate's --backend")
    ap.add_argument("--ctx-tokens", type=int, default=8192, help="run_agg's ctx_tokens (max batched tokens)")
    ap.add_argument("--tails", action="store_true", help="rerun twinserve's studies for TPOT p90/p99")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the SDK logs each fallback table it loads
    if args.csv is None:
        out = Path(tempfile.mkdtemp(prefix="aicrows_"))
        subprocess.run([sys.executable, "-m", "twinserve.sim.cli", "validate", "--silicon", "--backend",
                        args.backend, "--limit", str(args.limit), "--workers", "1", "--out", str(out)], check=True)
        args.csv = str(out / "validation.csv")
    from twinserve.sim.validate_rows import load_rows

    val = pd.read_csv(args.csv)
    rows = load_rows().set_index("id")
    aicm = pd.read_csv(args.csv_aic).set_index("row_id") if args.csv_aic else None
    recs = []
    for _, v in val.iterrows():
        row = rows.loc[v["row_id"]].copy()
        row["id"] = v["row_id"]
        ttft, tpot, why = aic_estimate(row, args.ctx_tokens)
        rec = {"row": v["row_id"][:48], "split": v["split"], "meas_tpot": v["meas_tpot_ms"],
               "aicfg_tpot": tpot, "aicfg_ttft": ttft, "twin_tpot": v["pred_tpot_ms"],
               "meas_ttft": v["meas_ttft_ms"], "twin_ttft": v["pred_ttft_ms"], "why": why,
               "twin_expressible": isinstance(v.get("pred_tpot_ms"), float) and v["pred_tpot_ms"] == v["pred_tpot_ms"]}
        if aicm is not None and v["row_id"] in aicm.index:
            rec["twin_aic_tpot"] = aicm.loc[v["row_id"], "pred_tpot_ms"]
            rec["twin_aic_ttft"] = aicm.loc[v["row_id"], "pred_ttft_ms"]
        rec["p90"] = rec["p99"] = float("nan")
        if args.tails and rec["twin_expressible"]:
            rec["p90"], rec["p99"] = twin_tails(row)
        recs.append(rec)
    df = pd.DataFrame(recs)
    print("| row | split | meas TPOT | AIConfigurator TPOT | twinserve TPOT | twinserve TPOT p90 / p99 | meas TTFT "
          "| AIConfigurator TTFT | twinserve TTFT |\n|" + "---|" * 9)
    f = lambda x: "-" if not x == x else f"{x:.1f}"  # noqa: E731
    for r in df.itertuples():
        print(f"| {r.row} | {r.split} | {f(r.meas_tpot)} | {f(r.aicfg_tpot)} | {f(r.twin_tpot)} | "
              f"{f(r.p90)} / {f(r.p99)} | {f(r.meas_ttft)} | {f(r.aicfg_ttft)} | {f(r.twin_ttft)} |")
    print("\nNot estimated by AIConfigurator's SDK:")
    for r in df[df["why"] != ""].itertuples():
        print(f"- {r.row}: {r.why}")
    print(f"\nTPOT median |error| / within 20% (rows); run_agg ctx_tokens={args.ctx_tokens}")
    cols = [("AIConfigurator", "aicfg_tpot"), ("twinserve roofline", "twin_tpot")]
    if "twin_aic_tpot" in df:
        cols.append(("twinserve aic", "twin_aic_tpot"))
    print("| rows | " + " | ".join(c for c, _ in cols) + " | " + " | ".join(f"all priced: {c}" for c, _ in cols) + " |")
    print("|" + "---|" * (2 * len(cols) + 1))
    for name, part in (("dev", df[df["split"] == "dev"]), ("held out", df[df["split"] != "dev"]), ("all", df)):
        cells = [stats(list(part[c] / part["meas_tpot"] - 1)) for _, c in cols]
        both = part.dropna(subset=[c for _, c in cols])  # the rows every estimator priced
        cells += [stats(list(both[c] / both["meas_tpot"] - 1)) for _, c in cols]
        print(f"| {name} ({len(part)}) | " + " | ".join(cells) + " |")
    both = df.dropna(subset=["aicfg_ttft", "twin_ttft"])
    print(f"\nTTFT median |error| / within 20% on the {len(both)} rows both priced: AIConfigurator "
          f"{stats(list(both['aicfg_ttft'] / both['meas_ttft'] - 1))}, twinserve roofline "
          f"{stats(list(both['twin_ttft'] / both['meas_ttft'] - 1))}")
    if "twin_aic_ttft" in df:
        every = df.dropna(subset=["aicfg_ttft", "twin_ttft", "twin_aic_ttft"])
        print(f"TTFT on the {len(every)} rows all three priced: AIConfigurator "
              f"{stats(list(every['aicfg_ttft'] / every['meas_ttft'] - 1))}, twinserve roofline "
              f"{stats(list(every['twin_ttft'] / every['meas_ttft'] - 1))}, twinserve aic "
              f"{stats(list(every['twin_aic_ttft'] / every['meas_ttft'] - 1))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
