"""DeepSeek-R1 TensorRT-LLM B200 FP4 aggregated development rows of a validation CSV: MTP against plain.

Reads a `simulate validate --silicon` CSV (no simulation) and prints, for the development rows only:
  1. the MTP rows (recipe names an _mtp script) and the plain rows by image, ISL/OSL and client range
     (median signed TPOT error, count of distinct measurements);
  2. every MTP measurement paired with the plain measurement of the same ISL, OSL, clients and parallelism
     column (images differ: MTP 1.2.0rc6.post3 against plain 1.2.0rc6.post2): the measured MTP / plain TPOT
     ratio against the predicted one. The ratio cancels what the step's price gets wrong in both and leaves
     what drafting (acceptance, draft forwards, verify rows) contributes.

Usage: python fp4_mtp_plain_csv.py DIR/validation.csv   (DIR: a `simulate validate --silicon --cost-model aic` run)
"""
import sys

import pandas as pd

KEYS = ["isl", "osl", "concurrency", "parallelism"]


def rows(path: str) -> pd.DataFrame:
    d = pd.read_csv(path)
    q = d.query("split == 'dev' and backend == 'trtllm' and system == 'b200_sxm' and mode == 'agg' and "
                "model == 'DeepSeek-R1' and precision == 'fp4' and err_tpot == err_tpot")
    q = q[q.backend_version.notna() & (q.backend_version != "1.3.0rc1")]
    q = q.drop_duplicates(["backend_version"] + KEYS)  # twin records of one measurement
    return q.assign(mtp=q.recipe.str.contains("_mtp", regex=False),
                    clients=pd.cut(q.concurrency, [0, 32, 1e9], labels=["<=32", ">32"]))


def main(path: str) -> None:
    q = rows(path)
    pd.set_option("display.width", 200)
    g = q.groupby(["mtp", "backend_version", "isl", "osl", "clients"], observed=True)
    print(g.err_tpot.agg(n="size", signed_median=lambda s: round(100 * s.median(), 1)).to_string())
    j = q[q.mtp].merge(q[~q.mtp], on=KEYS, suffixes=("_mtp", "_plain"))
    j["meas_ratio"] = j.meas_tpot_ms_mtp / j.meas_tpot_ms_plain
    j["pred_ratio"] = j.pred_tpot_ms_mtp / j.pred_tpot_ms_plain
    j["ratio_err"] = j.pred_ratio / j.meas_ratio - 1
    print(j[KEYS + ["err_tpot_mtp", "err_tpot_plain", "meas_ratio", "pred_ratio", "ratio_err"]]
          .sort_values(KEYS).round(3).to_string(index=False))
    print(f"pairs {len(j)}: ratio error median |.| {100 * j.ratio_err.abs().median():.1f}%, "
          f"signed {100 * j.ratio_err.median():+.1f}%")


if __name__ == "__main__":
    main(sys.argv[1])
