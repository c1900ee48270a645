"""DeepSeek-R1 TensorRT-LLM development rows that draft MTP, each paired with the plain (no-draft) rows of the
same launch shape: system, precision, mode, ISL/OSL, clients and every parallelism column equal, the row
study drafting nothing. The pair's measured and predicted TPOT ratios (MTP / plain) cancel what the step's
price gets wrong in both, leaving what the drafts do: acceptance.

Rows are matched by their configuration columns only, never by measured figures; development rows only.

    .venv/bin/python experiments/mtp_plain_pairs.py --out plain.csv   # simulates the plain partners
"""
from __future__ import annotations

import argparse
import warnings

import pandas as pd

SHAPE = ["system", "precision", "mode", "isl", "osl", "concurrency", "tp_size", "attention_dp_size", "moe_tp_size",
         "moe_ep_size", "prefill_num_workers", "prefill_tp_size", "prefill_attention_dp_size", "prefill_moe_ep_size",
         "decode_num_workers", "decode_tp_size", "decode_attention_dp_size", "decode_moe_ep_size"]


def depth_of(r: pd.Series) -> int:
    from twinserve.sim.validate_rows import row_plan
    try:
        spec = row_plan(r, "aic").cfg.speculative
    except Exception:
        return -1
    return spec.num_speculative_tokens if spec.method else 0


def plain_partners(max_clients: int) -> pd.DataFrame:
    """Plain DeepSeek-R1 TensorRT-LLM development rows whose launch shape an MTP row shares (column `shape`)."""
    from twinserve.sim.validate_rows import load_rows
    rows = load_rows()
    rows = rows[(rows.split == "dev") & (rows.model == "DeepSeek-R1") & (rows.backend == "trtllm")
                & (rows.concurrency <= max_clients)].copy()
    rows["mtp"] = [depth_of(r) for _, r in rows.iterrows()]
    key = pd.Series(["|".join(str(v) for v in t) for t in rows[SHAPE].itertuples(index=False)], index=rows.index)
    rows["shape"] = key
    mtp_shapes = set(key[rows.mtp > 0])
    plain = rows[(rows.mtp == 0) & key.isin(mtp_shapes)]
    same = SHAPE + ["backend_version", "silicon_tpot_ms", "silicon_ttft_ms"]
    return plain.drop_duplicates(same)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write, one line a row")
    p.add_argument("--max-clients", type=int, default=128,
                   help="rows of at most this many clients (the validation runs' cut)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    from twinserve.sim.validate import simulate_row
    rows = plain_partners(a.max_clients)
    recs = []
    for _, r in rows.iterrows():
        res = simulate_row((r.to_dict(), "aic", {}))
        recs.append({"row_id": r["id"], "shape": r["shape"], "backend_version": r["backend_version"],
                     "meas_tpot_ms": float(r["silicon_tpot_ms"]), "pred_tpot_ms": res["pred_tpot_ms"]})
        print(r["id"], round(res["pred_tpot_ms"], 3), flush=True)
    pd.DataFrame(recs).to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
