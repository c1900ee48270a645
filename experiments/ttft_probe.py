"""Measured TTFT and TPOT of the development rows against single roofline steps (docs/validate-accuracy.md).

    python experiments/ttft_probe.py four-clients   # measured TTFT / one prefill step, 4-client rows
    python experiments/ttft_probe.py lockstep       # Qwen3-32B H100: TTFT / whole-wave prefill, TPOT / decode

four-clients: at 4 clients queueing is small, so the measured TTFT over one prefill step of 0.9 ISL
(the benchmark's mean prompt) beside 3 decodes shows what the engine's steps leave out; per model
and GPU it also fits measured = a + b x step. lockstep: if a wave of N clients runs in lock step
(prefill the wave in 8,192-token chunks, then decode without prefills), TTFT is about half the
wave's chunks and TPOT one decode step at batch N. Development rows only; the CSV is read from the
installed aiconfigurator-core.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd

from twinserve.backends.sim.aic_models import resolve_row_model
from twinserve.backends.sim.catalog import hardware_for_aic_system
from twinserve.backends.sim.cost_model import Efficiency, roofline_for
from twinserve.backends.sim.engine_profile import ENGINE_PROFILES
from twinserve.backends.sim.parallel import Parallelism
from twinserve.backends.sim.precision import Precision
from twinserve.sim.validate_rows import ENGINE_PROFILE, load_rows, precision_fields


def _cost(r: pd.Series):
    m = resolve_row_model(r.model_path)
    p = precision_fields(r)
    m = m.with_precision(Precision(quantization=p["quantization"], kv_cache_dtype=p["kv_cache_dtype"]))
    hw = hardware_for_aic_system(r.system)
    prof = ENGINE_PROFILES[ENGINE_PROFILE[r.backend]]
    ep = int(r.moe_ep_size) if m.is_moe and r.moe_ep_size == r.moe_ep_size and r.moe_ep_size >= 1 else 1
    eff = Efficiency.for_hardware(hw, step_overhead_s=prof.step_overhead_s,
                                  per_seq_overhead_s=prof.per_seq_overhead_s)
    return m, p["quantization"], roofline_for(m, hw, Parallelism(int(r.tp_size), 1, ep, 1), eff)


def four_clients(d: pd.DataFrame) -> None:
    """Measured TTFT over one prefill step, 4-client aggregated rows without attention DP or PP."""
    d = d[(d["mode"] == "agg") & (d.concurrency <= 4) & (d.attention_dp_size.fillna(1) <= 1)
          & (d.pp_size.fillna(1) <= 1)]
    out = []
    for _, r in d.iterrows():
        try:
            m, q, c = _cost(r)
        except Exception:  # a layout the roofline refuses: not this probe's question
            continue
        isl, n = int(r.isl * 0.9), int(r.concurrency) - 1
        step = c.step_time(isl, 1, 0, isl * isl / 2, n, n * int(r.isl + r.osl / 2)) * 1e3
        out.append({"model": r.model, "system": r.system, "prec": q, "moe": m.is_moe,
                    "meas": r.silicon_ttft_ms, "step": step, "ratio": r.silicon_ttft_ms / step})
    o = pd.DataFrame(out)
    print(o.groupby(["moe", "model", "system", "prec"]).ratio.agg(["median", "size"]).round(2))
    for k, g in o.groupby(["model", "system"]):
        if len(g) >= 5:
            b, a = np.polyfit(g.step, g.meas, 1)
            print(f"{k}: {len(g)} rows, measured = {a:.0f} ms + {b:.2f} x step")


def lockstep(d: pd.DataFrame) -> None:
    """Qwen3-32B H100 rows: measured TTFT / whole-wave prefill and TPOT / one decode step, per engine."""
    d = d[(d.model == "Qwen3-32B") & (d["mode"] == "agg") & (d.system == "h100_sxm")]
    out = []
    for _, r in d.iterrows():
        _, _, c = _cost(r)
        n, isl, osl = int(r.concurrency), int(r.isl), int(r.osl)
        chunk = min(8192, n * isl)
        step = c.step_time(chunk, max(1, min(n, 8192 // isl)), 0, chunk * isl / 2, 0, 0)
        ttft = (math.ceil(n * isl / 8192) + 1) / 2 * step * 1e3
        tpot = c.step_time(0, 0, 0, 0, n, n * (isl + osl // 2)) * 1e3
        out.append({"backend": r.backend, "ttft": r.silicon_ttft_ms / ttft, "tpot": r.silicon_tpot_ms / tpot})
    o = pd.DataFrame(out)
    print(o.groupby("backend").agg(rows=("ttft", "size"), ttft_over_wave=("ttft", "median"),
                                   tpot_over_decode=("tpot", "median")).round(2))


def main() -> None:
    """Parse the probe name and print it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=("four-clients", "lockstep"))
    args = ap.parse_args()
    rows = load_rows()
    dev = rows[rows["split"] == "dev"]
    (four_clients if args.probe == "four-clients" else lockstep)(dev)


if __name__ == "__main__":
    main()
