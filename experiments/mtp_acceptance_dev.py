"""DeepSeek-R1 development rows that draft MTP: their TPOT under a given per-position MTP acceptance.

Picks the rows by the draft depth of their own row study (sim/validate_rows.row_plan under aic: the
InferenceX recipe or entry that ran MTP), never by their measured figures; development rows only, up to
--max-clients clients. Each row is simulated as `simulate validate --cost-model aic` runs it
(sim/validate.simulate_row), with sim/validate_recipes.MTP_ACCEPTANCE set to --rate for the run.

    .venv/bin/python experiments/mtp_acceptance_dev.py --rate 0.85 --out mtp085.csv
"""
from __future__ import annotations

import argparse
import warnings

import pandas as pd


def mtp_rows(max_clients: int) -> pd.DataFrame:
    """Development DeepSeek-R1 rows whose row study drafts MTP, with the depth (column `mtp`)."""
    from twinserve.sim.validate_rows import load_rows, row_plan
    rows = load_rows()
    rows = rows[(rows.split == "dev") & (rows.model == "DeepSeek-R1") & (rows.concurrency <= max_clients)]
    keep = []
    for i, r in rows.iterrows():
        try:
            spec = row_plan(r, "aic").cfg.speculative
        except Exception:  # not expressible: not simulated by validate either
            continue
        if spec.method and spec.num_speculative_tokens > 0:
            keep.append((i, spec.num_speculative_tokens))
    out = rows.loc[[i for i, _ in keep]].copy()
    out["mtp"] = [d for _, d in keep]
    # The file's twin records of one measurement (sim/validate_twins.py) are simulated once.
    same = ["system", "precision", "mode", "isl", "osl", "concurrency", "backend_version",
            "silicon_tpot_ms", "silicon_ttft_ms"]
    return out.drop_duplicates(same)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, required=True, help="P(a drafted position is accepted | those before)")
    p.add_argument("--out", required=True, help="CSV to write, one line a row")
    p.add_argument("--max-clients", type=int, default=128,
                   help="rows of at most this many clients (the validation runs' cut)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    from twinserve.sim import validate_recipes
    from twinserve.sim.validate import simulate_row
    validate_recipes.MTP_ACCEPTANCE = a.rate
    rows = mtp_rows(a.max_clients)
    recs = []
    for _, r in rows.iterrows():
        res = simulate_row((r.to_dict(), "aic", {}))
        recs.append({"row_id": r["id"], "system": r["system"], "precision": r.get("precision"),
                     "mode": r["mode"], "isl": int(r["isl"]), "osl": int(r["osl"]),
                     "concurrency": int(r["concurrency"]), "mtp": int(r["mtp"]),
                     "backend_version": r["backend_version"],
                     "meas_tpot_ms": float(r["silicon_tpot_ms"]), "pred_tpot_ms": res["pred_tpot_ms"],
                     "meas_ttft_ms": float(r["silicon_ttft_ms"]), "pred_ttft_ms": res["pred_ttft_ms"],
                     "sim_wall_s": res["sim_wall_s"]})
        print(recs[-1]["row_id"], round(res["pred_tpot_ms"], 3), flush=True)
    df = pd.DataFrame(recs)
    df["err_tpot"] = df.pred_tpot_ms / df.meas_tpot_ms - 1
    df["err_ttft"] = df.pred_ttft_ms / df.meas_ttft_ms - 1
    df["rate"] = a.rate
    df.to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
