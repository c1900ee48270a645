"""Rows' CPU seconds and predictions with LazyDecodes' count_blocks off and on, in one process.

    PYTHONSAFEPATH=1 OMP_NUM_THREADS=1 python experiments/count_blocks_ab.py ID[,ID...] new,old[,new...]

Runs sim.validate.simulate_row (aic, the default options) for each row id, once per mode in the order
given ('old': LazyDecodes' count_blocks False, blocks handed out at each crossing; 'new': True, as
sim.validate.run_to_window sets it), and prints one JSON line each: the process's CPU seconds and
every pred_* figure. The first run of a row's system loads its tables: put a warm-up first where the
ratio matters
(docs/validate-speed.md, "Plain decodes' blocks as counts").
"""

from __future__ import annotations

import json
import sys
import time

import twinserve.sim.cluster as cluster
from twinserve.sim.validate import simulate_row
from twinserve.sim.validate_rows import load_rows


def main(ids: list[str], modes: list[str]) -> None:
    real = cluster.LazyDecodes
    mode = {"count": True}

    def lazy(*a, **k):  # whatever the run asked for (sim.validate.run_to_window asks for counts)
        k["count_blocks"] = mode["count"]
        return real(*a, **k)

    cluster.LazyDecodes = lazy
    df = load_rows()
    rows = {r["id"]: r.to_dict() for _, r in df[df["id"].isin(ids)].iterrows()}
    for i in ids:
        for m in modes:
            mode["count"] = m == "new"
            c0 = time.process_time()
            res = simulate_row((rows[i], "aic", {}))
            cpu = time.process_time() - c0
            print(json.dumps({"id": i, "mode": m, "cpu": round(cpu, 2),
                              **{k: v for k, v in res.items() if k.startswith("pred")}}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2].split(","))
