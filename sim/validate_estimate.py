"""The benchmark's 10 N means from its first K waves: a cheaper estimator for rows of many clients.

InferenceX counts every one of 10 N requests (sim/validate_protocol.py). Past the cold wave and the
move into steady state, a closed loop repeats itself wave after wave, so a run of K + 1 waves
(drain_study) whose first K are the benchmark's first K and whose last drains as the benchmark's
10th does (load falling as clients finish with nothing left to send), with the last of the K
waves' mean given to each wave between, estimates the 10 N mean as the benchmark weighs it: every
request once. Without the drain wave TPOT comes out 1.4-2% high (the drain's lighter batches).
docs/validate-speed.md compares it with full runs on development rows, where K and the switch were chosen.
"""

from __future__ import annotations

import copy
from typing import Any

import pandas as pd

# Waves simulated before extrapolating (then one drain wave): the cold wave, the transition, steady
# waves. On 50 development rows of 64-256 clients K = 4 kept TTFT within 4.6% and TPOT within 2.4% of
# the full run, K = 3 TTFT within 22% (docs/validate-speed.md).
ESTIMATE_WAVES = 4
# Rows of at least this many clients are estimated under `--window benchmark`; fewer run in full
# (below it the full run is cheap). Chosen on development rows (docs/validate-speed.md).
ESTIMATE_MIN_CLIENTS = 64
# From this many clients on, K = FEWER_WAVES: 13 development rows of 256-1,024 clients kept TTFT within
# 3.7% and TPOT within 1.7% of the full run (K = 4: 2.4%, 1.1%); below 256 K = 3 reached 22% (docs/validate-speed.md).
FEWER_WAVES_MIN_CLIENTS = 256
FEWER_WAVES = 3
FULL = "full"


def estimate_waves(concurrency: int) -> int:
    """K, the waves simulated before the drain wave, for a row of `concurrency` clients."""
    return FEWER_WAVES if concurrency >= FEWER_WAVES_MIN_CLIENTS else ESTIMATE_WAVES


def estimator_label(waves: int) -> str:
    """validation.csv's `estimator` for a row estimated from its first `waves` waves."""
    return f"waves{waves}+extrapolated"


def uses_estimate(concurrency: int, total_waves: int, waves: int | None = None,
                  min_clients: int = ESTIMATE_MIN_CLIENTS) -> bool:
    """True when a benchmark row of `concurrency` clients is estimated rather than run in full.

    waves: K (None: estimate_waves(concurrency)).
    """
    k = estimate_waves(concurrency) if waves is None else waves
    return concurrency >= min_clients and k < total_waves


def drain_study(cfg: Any, concurrency: int, waves: int = ESTIMATE_WAVES) -> Any:
    """A copy of a benchmark row's study that sends waves + 1 waves: the last one drains as the 10th does."""
    out = copy.deepcopy(cfg)
    out.workload.num_requests = (waves + 1) * concurrency - int(getattr(out.workload, "warmup_requests", 0) or 0)
    return out


def wave_estimate(req: pd.DataFrame, concurrency: int, total_waves: int, waves: int,
                  tail: int = 1, drain: bool = False) -> dict[str, float]:
    """Mean TTFT, TPOT and E2E (ms) over total_waves x N requests from the first `waves` x N in send order.

    Wave w is requests w N .. (w + 1) N - 1 in arrival order; waves past the simulated ones take the
    mean of the last `tail` simulated waves, each request weighing once as in the benchmark's 10 N mean. With
    waves >= total_waves this is the plain mean of every request (the full run's figure, exactly).
    drain: req also holds wave `waves`, the last of a run of waves + 1 (drain_study), which stands
    for the benchmark's last wave, run down as clients finish with nothing left to send.
    """
    order = req.sort_values(["arrival_s", "request_id"], kind="stable")
    if waves >= total_waves or (drain and waves + 1 >= total_waves):
        done = order.iloc[:total_waves * concurrency]
        return {"ttft_ms": float(done["ttft_s"].mean() * 1000), "tpot_ms": float(done["tpot_s"].mean() * 1000),
                "e2e_ms": float(done["e2e_s"].mean() * 1000), "n": int(done["ttft_s"].notna().sum())}
    sim = order.iloc[:waves * concurrency]
    if len(sim) < waves * concurrency:
        raise ValueError(f"wave_estimate: {len(sim)} requests simulated, {waves} waves of {concurrency} need "
                         f"{waves * concurrency}")
    if not 1 <= tail <= waves:
        raise ValueError(f"wave_estimate: tail {tail}: allowed 1 .. waves ({waves})")
    last = sim.iloc[(waves - tail) * concurrency:]
    tail_end = order.iloc[waves * concurrency:(waves + 1) * concurrency] if drain else order.iloc[:0]
    if drain and len(tail_end) < concurrency:
        raise ValueError(f"wave_estimate: drain wave has {len(tail_end)} requests, {concurrency} needed")
    rest = total_waves - waves - (1 if drain else 0)  # unsimulated waves, N requests each
    out: dict[str, float] = {}
    for col, key in (("ttft_s", "ttft_ms"), ("tpot_s", "tpot_ms"), ("e2e_s", "e2e_ms")):
        known, tail_v = pd.concat([sim[col], tail_end[col]]).dropna(), last[col].dropna()
        # Each unsimulated wave stands for as many counted requests as a tail wave has, at its mean.
        total = known.sum() + rest * tail_v.sum() / tail
        count = len(known) + rest * len(tail_v) / tail
        out[key] = float(total / count * 1000) if count else float("nan")
    out["n"] = int(round(sim["ttft_s"].notna().sum() + tail_end["ttft_s"].notna().sum()
                         + rest * last["ttft_s"].notna().sum() / tail))
    return out
