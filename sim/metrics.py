"""Per-request and per-run metrics as pandas DataFrames (vLLM bench / Vidur vocabulary).

TPOT excludes the first token: (finish - first token) / (output tokens - 1).
ITL is every gap between consecutive tokens of a request.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
import pandas as pd

from twinserve.sim.config import SLOConfig
from twinserve.sim.world import RunResult

PERCENTILES = (50, 90, 99)


def requests_frame(result: RunResult, itl: bool = True) -> pd.DataFrame:
    """One row per request: arrival, queueing delay, TTFT, TPOT, E2E, ITL list, hits, preemptions.

    A closed-loop run's table also has its client and a warmup column (True: not measured).
    itl=False leaves the ITL lists empty (a caller reading means only: the lists cost the most).
    """
    records = result.records
    closed = any(r.client >= 0 for r in records)
    # Built column by column (a list of row dicts costs pandas a second per ~60,000 requests); the
    # same values and dtypes as a frame of one dict a request.
    cols: dict[str, list[Any]] = {name: [] for name in _REQUEST_COLUMNS}
    if closed:
        cols["client"] = []
        cols["warmup"] = []
    (request_id, conversation, turn, arrival, prompt, output, queue, ttft, tpot, e2e, finish, hits,
     preemptions, itls, reason, error, replica) = (cols[name] for name in _REQUEST_COLUMNS)
    nan = np.nan
    for r in records:
        first = r.first_token_time
        end = r.finish_time
        done = end is not None and first is not None
        n = r.num_output_tokens
        a = r.arrival_time
        sched = r.first_scheduled_time
        request_id.append(r.request_id)
        conversation.append(r.conversation)
        turn.append(r.turn)
        arrival.append(a)
        prompt.append(r.num_prompt_tokens)
        output.append(n)
        queue.append((sched - a) if sched is not None else nan)
        ttft.append((first - a) if done else nan)
        tpot.append(((end - first) / (n - 1)) if done and n > 1 else nan)
        e2e.append((end - a) if done else nan)
        finish.append(end if done else nan)
        hits.append(r.prefix_hit_tokens)
        preemptions.append(r.num_preemptions)
        if itl:
            tt = r.token_times
            itls.append([y - x for x, y in zip(tt, tt[1:])])
        else:
            itls.append([])
        reason.append(r.finish_reason)
        error.append(r.error)
        replica.append(r.replica)
        if closed:
            cols["client"].append(r.client)
            cols["warmup"].append(r.warmup)
    if not records:
        return pd.DataFrame()
    return pd.DataFrame(cols)


_REQUEST_COLUMNS = ("request_id", "conversation", "turn", "arrival_s", "prompt_tokens", "output_tokens",
                    "queue_s", "ttft_s", "tpot_s", "e2e_s", "finish_s", "prefix_hit_tokens", "preemptions",
                    "itl_s", "finish_reason", "error", "replica")


def measured_window(req: pd.DataFrame) -> tuple[float, float] | None:
    """A closed-loop run's measured window: first measured send to last measured finish.

    None for an open-loop run (no warmup column): it is measured from 0 to its end.
    """
    if "warmup" not in req.columns or req.empty:
        return None
    measured = req[~req["warmup"].astype(bool)]
    if measured.empty:
        return None
    start = float(measured["arrival_s"].min())
    end = float(measured["finish_s"].max()) if measured["finish_s"].notna().any() else start
    return start, max(end, start)


def mark_warmup_steps(steps: pd.DataFrame, req: pd.DataFrame) -> pd.DataFrame:
    """A closed-loop run's step table with a warmup column: True for steps before its window."""
    window = measured_window(req)
    if window is not None and not steps.empty:
        steps = steps.assign(warmup=steps["start_s"] < window[0])
    return steps


def window_steps(steps: pd.DataFrame, window: tuple[float, float]) -> pd.DataFrame:
    """The steps that start inside the window (times shifted to start at 0)."""
    if steps.empty:
        return steps
    start, end = window
    inside = steps[(steps["start_s"] >= start) & (steps["start_s"] < end)].copy()
    inside["start_s"] -= start
    return inside


def steps_frame(result: RunResult) -> pd.DataFrame:
    """One row per engine step: time, duration, batch, queue and KV usage."""
    s = result.steps
    cols = {"start_s": s.start, "duration_s": s.duration, "num_in_system": s.in_system,
            "num_running": s.running, "num_waiting": s.waiting, "num_tokens": s.tokens,
            "batch_size": s.seqs, "kv_usage": s.kv_usage, "num_preempted": s.preempted}
    if len(s.start):
        # numpy infers the dtype pandas would (int64, float64) from a list of Python numbers at a
        # third of pandas' own cost (it goes through an object array): a cluster run's rows
        # hold 10^4 steps a replica. An empty log keeps pandas' own (object) columns.
        return pd.DataFrame({k: np.array(v) for k, v in cols.items()})
    return pd.DataFrame(cols)


def _dist(prefix: str, values: np.ndarray, out: dict[str, Any]) -> None:
    values = values[~np.isnan(values)]
    if len(values) == 0:
        out[f"mean_{prefix}"] = np.nan
        for p in PERCENTILES:
            out[f"p{p}_{prefix}"] = np.nan
        return
    out[f"mean_{prefix}"] = float(values.mean())
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES)):
        out[f"p{p}_{prefix}"] = float(v)


def time_average(steps: pd.DataFrame, column: str, horizon: float) -> float:
    """Time-weighted mean of a per-step quantity over [0, horizon] (idle time counts as 0)."""
    if horizon <= 0 or steps.empty:
        return 0.0
    return float((steps[column] * steps["duration_s"]).sum() / horizon)


def itl_values(token_times: Sequence[Sequence[float]]) -> np.ndarray:
    """Every request's inter-token gaps, in order (requests_frame's itl_s lists, flattened)."""
    lists = [tt for tt in token_times if len(tt) > 1]
    if not lists:
        return np.empty(0, dtype=float)
    flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=float)
    # One diff over all requests; drop the gap from each request's last token to the next's first.
    bounds = np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)))[:-1] - 1
    return np.delete(np.diff(flat), bounds)


def summarize(result: RunResult, req: pd.DataFrame, steps: pd.DataFrame, slo: SLOConfig,
              extra: dict[str, Any] | None = None,
              token_times: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """Run-level numbers: throughput, goodput, latency percentiles, KV, preemptions, MFU/MBU.

    A closed-loop run counts its measured requests only, over its measured window (rates and
    time averages); warm-up requests are counted in warmup_requests. With token_times (each
    record's, in req's order) ITLs come from them, so req may be built with itl=False.
    """
    window = measured_window(req)
    out: dict[str, Any] = dict(extra or {})
    horizon = result.end_time
    if window is not None:
        warm = req["warmup"].astype(bool)
        out["warmup_requests"] = int(warm.sum())
        out["measured_window_s"] = window[1] - window[0]
        req = req[~warm]
        steps = window_steps(steps, window)
        horizon = window[1] - window[0]
    done = req[req["finish_s"].notna()] if not req.empty else req
    out["num_requests"] = len(req)
    out["completed"] = len(done)
    out["refused"] = int((req["finish_reason"] == "refused").sum()) if not req.empty else 0
    out["duration_s"] = horizon
    dur = horizon if horizon > 0 else float("nan")
    out["request_throughput"] = len(done) / dur
    out["output_throughput"] = float(done["output_tokens"].sum()) / dur
    out["total_token_throughput"] = float((done["output_tokens"] + done["prompt_tokens"]).sum()) / dur
    good = done[(done["ttft_s"] <= slo.ttft_s) & (done["tpot_s"].fillna(0.0) <= slo.tpot_s)]
    out["goodput"] = len(good) / dur
    out["slo_attainment"] = len(good) / len(done) if len(done) else np.nan
    for name in ("ttft", "tpot", "e2e", "queue"):
        _dist(f"{name}_s", done[f"{name}_s"].to_numpy(dtype=float), out)
    if token_times is None:
        itl = np.fromiter((x for lst in done["itl_s"] for x in lst), dtype=float)
    else:  # req has a RangeIndex over the records: done.index picks their token times
        itl = itl_values([token_times[i] for i in done.index])
    _dist("itl_s", itl, out)
    out["preemptions"] = (int(req["preemptions"].sum()) if window is not None and not req.empty
                          else result.num_preemptions)
    out["prefix_hit_rate"] = (result.prefix_hits / result.prefix_queries
                              if result.prefix_queries else 0.0)
    out["mean_kv_usage"] = time_average(steps, "kv_usage", horizon)
    out["max_kv_usage"] = float(steps["kv_usage"].max()) if not steps.empty else 0.0
    out["mean_batch_size"] = time_average(steps, "batch_size", horizon)
    out["mean_queue_len"] = time_average(steps, "num_waiting", horizon)
    # Little's law, both sides from the run: L from the engine's own counts over time,
    # lambda * W from request timestamps.
    out["littles_L"] = time_average(steps, "num_in_system", horizon)
    out["littles_lambdaW"] = (len(done) / dur) * float(done["e2e_s"].mean()) if len(done) else 0.0
    out["num_steps"] = result.num_steps
    out["kv_blocks"] = result.num_blocks
    out["sim_wall_s"] = result.wall_time
    out["sim_requests_per_wall_s"] = len(req) / result.wall_time if result.wall_time else np.nan
    return out


def slo_row(result: RunResult, columns: Sequence[str]) -> dict[str, Any]:
    """summarize's verdict columns of an open-loop run, without its tables: num_requests,
    completed, refused, duration_s, the three throughputs, and each column of `columns` named
    STAT_METRIC_s (STAT mean/p50/p90/p99, METRIC ttft/tpot/e2e/queue/itl).

    Each value is summarize's to the bit: the same per-request values in the same (record)
    order through the same _dist. For runs whose row is only judged (a capacity search's
    extra seeds, sim.search_band): the pandas tables are 10-13% of such a run's CPU. ITL
    columns need the records' token times. A closed loop's warm-up is not handled: use summarize.
    """
    records = result.records
    done = [r for r in records if r.finish_time is not None and r.first_token_time is not None]
    horizon = result.end_time
    dur = horizon if horizon > 0 else float("nan")
    out: dict[str, Any] = {
        "num_requests": len(records), "completed": len(done),
        "refused": sum(1 for r in records if r.finish_reason == "refused"),
        "duration_s": horizon, "request_throughput": len(done) / dur,
        "output_throughput": float(sum(r.num_output_tokens for r in done)) / dur,
        "total_token_throughput": float(sum(r.num_output_tokens + r.num_prompt_tokens
                                            for r in done)) / dur}
    wanted = {c.split("_")[1] for c in columns if c.count("_") == 2}
    nan = np.nan
    for name in ("ttft", "tpot", "e2e", "queue", "itl"):
        if name not in wanted:
            continue
        if name == "ttft":
            v = [r.first_token_time - r.arrival_time for r in done]
        elif name == "tpot":
            v = [(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
                 if r.num_output_tokens > 1 else nan for r in done]
        elif name == "e2e":
            v = [r.finish_time - r.arrival_time for r in done]
        elif name == "queue":
            v = [r.first_scheduled_time - r.arrival_time
                 if r.first_scheduled_time is not None else nan for r in done]
        stats: dict[str, Any] = {}
        if name == "itl":
            _dist("itl_s", itl_values([r.token_times for r in done]), stats)
        else:
            _dist(f"{name}_s", np.array(v, dtype=float), stats)
        out.update((k, x) for k, x in stats.items() if k in columns)
    return out


def beyond_fit(executors: Sequence[Any]) -> dict[str, float]:
    """Shares of steps and busy time priced beyond the profile's fitted shapes ({} if unrecorded)."""
    tots = [ex.totals for ex in executors if getattr(ex, "fit_range_max", None) is not None]
    if not tots:
        return {}
    steps, busy = sum(t.num_steps for t in tots), sum(t.busy_time for t in tots)
    return {"steps_beyond_fit": sum(t.beyond_fit_steps for t in tots) / steps if steps else 0.0,
            "busy_beyond_fit": sum(t.beyond_fit_time for t in tots) / busy if busy else 0.0}
