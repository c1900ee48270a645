"""Build and run a cluster study: replicas from [engine]/[scheduler] plus per-replica overrides.

Cluster numbers reuse sim.metrics.summarize, plus load imbalance, cluster prefix hit rate and a
per-replica table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd


from twinserve.backends.sim.host_link import HostTierExecutor
from twinserve.sim.build import BuiltEngine, build_replica_engine, build_workload, check_pool_memory
from twinserve.sim.cluster import ClusterResult, ClusterSimulation, Replica
from twinserve.sim.config import StudyConfig, replica_config
from twinserve.sim.metrics import beyond_fit, requests_frame, steps_frame, summarize
from twinserve.sim.workload import Workload


@dataclass(slots=True)
class BuiltCluster:
    """The pieces of one cluster study."""

    cfg: StudyConfig
    engines: list[BuiltEngine]
    workload: Workload
    simulation: ClusterSimulation


def build_cluster(cfg: StudyConfig, keep_steps: bool = True, keep_records: bool = True,
                  on_record: Any = None) -> BuiltCluster:
    """Every replica (its own cost model and KV pool), the router and the workload."""
    c = cfg.cluster
    check_pool_memory(cfg)
    engines = [build_replica_engine(cfg, i) for i in range(c.num_replicas)]
    replicas = [Replica(i, eng.core, eng.executor,
                        f"{eng.hardware.name} TP{replica_config(cfg, i).engine.tensor_parallel_size}",
                        keep_steps)
                for i, eng in enumerate(engines)]
    workload = build_workload(cfg)
    router = c.router_config().build(cfg.run.seed)
    if c.num_prefill_replicas > 0:
        from twinserve.sim.disagg import DecodeExecutor, DisaggregatedSimulation

        n = c.num_prefill_replicas
        for i, (eng, rep) in enumerate(zip(engines[n:], replicas[n:]), start=n):
            decode = DecodeExecutor(eng.cost_model, eng.executor.totals.window,
                                    join_as_decode=c.disagg_join_row == "decode",
                                    join_ranks=replica_config(cfg, i).engine.data_parallel_size)
            # Speculation carries over: the acceptance draws, when a batch drafts, and the draft model's steps.
            old = eng.executor
            decode.spec, decode.spec_active, decode.draft = old.spec, old.spec_active, old.draft
            eng.executor = rep.executor = decode
            if isinstance(eng.core.executor, HostTierExecutor):  # the tier's copies around the decode steps
                eng.core.executor.inner = eng.executor
            else:
                eng.core.executor = eng.executor
        for rep in replicas:
            rep.label += " prefill" if rep.index < c.num_prefill_replicas else " decode"
        bandwidth, kv_bytes = kv_link(cfg, engines[c.num_prefill_replicas])
        sim: ClusterSimulation = DisaggregatedSimulation(
            replicas, workload, router, c.num_prefill_replicas, bandwidth, c.kv_link_latency_s,
            kv_bytes, first_token=c.disagg_first_token,
            decode_router=c.disagg_decode_router, fast_forward=cfg.run.fast_forward,
            prealloc_reserve=c.disagg_reserved_decode_tokens if c.disagg_admission == "prealloc" else None,
            on_record=on_record, keep_records=keep_records)
    else:
        sim = ClusterSimulation(replicas, workload, router, cfg.run.fast_forward,
                                on_record=on_record, keep_records=keep_records)
    return BuiltCluster(cfg, engines, workload, sim)


def kv_link(cfg: StudyConfig, decode: BuiltEngine) -> tuple[float, int]:
    """One decode GPU's KV link (bytes/s) and the KV bytes a prompt token sends it, for the transfer time.

    Each GPU of the decode worker's attention group receives its own part of a request's KV over its own
    link, all at once, so the transfer takes one GPU's bytes over one GPU's link. One GPU's bytes: its
    share of the K/V heads, or, for MLA, the whole latent (ModelSpec.kv_bytes_per_token_per_gpu): every
    attention-TP rank holds all of it, and SGLang's decode rank pulls it whole from one prefill rank
    (sgl-project/sglang python/sglang/srt/disaggregation/common/conn.py @ad7733e, CommonKVReceiver: equal
    attention TP sizes, `target_tp_rank` = the decode rank's own; a smaller decode TP, "For MLA models, we
    can retrieve KVCache from only one prefill rank"). One GPU's link: NVLink where a prefill worker's and a
    decode worker's GPUs fit one NVLink domain (an NVL72 rack), else the network past it (an HGX board's
    8 GPUs: the prefill and decode workers' own nodes; HardwareSpec.collective_bandwidth), unless
    [cluster] kv_link_bandwidth sets it. Until 2026-12-06 the transfer took the whole model's KV over
    NVLink times the TP ranks: for MLA a TP-th of the bytes, and NVLink between HGX nodes."""
    c = cfg.cluster
    pre = replica_config(cfg, 0).engine
    dec = replica_config(cfg, c.num_prefill_replicas).engine
    pair_gpus = (pre.tensor_parallel_size * pre.data_parallel_size
                 + dec.tensor_parallel_size * dec.data_parallel_size)
    link = c.kv_link_bandwidth or decode.hardware.collective_bandwidth(pair_gpus)
    return link, decode.model.kv_bytes_per_token_per_gpu(dec.tensor_parallel_size)


def simulate_cluster(cfg: StudyConfig) -> tuple[BuiltCluster, ClusterResult]:
    """Build and run one cluster study."""
    built = build_cluster(cfg)
    return built, built.simulation.run()


def imbalance(values: list[float]) -> float:
    """Most-loaded over mean (1.0 = perfectly even; 0 when nothing happened)."""
    mean = float(np.mean(values)) if values else 0.0
    return float(max(values)) / mean if mean > 0 else 0.0


def replicas_frame(built: BuiltCluster, res: ClusterResult, req: pd.DataFrame) -> pd.DataFrame:
    """One row per replica: routed, completed, busy share, KV, prefix hits, latencies.

    Closed loop: completed and latencies count measured requests; routed counts every one sent.
    """
    if "warmup" in req.columns:
        req = req[~req["warmup"].astype(bool)]
    rows = []
    horizon = res.total.end_time
    for i, r in enumerate(res.replicas):
        mine = req[req["replica"] == i] if not req.empty else req
        done = mine[mine["finish_s"].notna()] if not mine.empty else mine
        rep = built.simulation.replicas[i]
        eng = built.engines[i]
        rows.append({
            "replica": i,
            "hardware": res.labels[i],
            "routed": res.routed[i],
            "completed": len(done),
            "busy_fraction": rep.busy_time / horizon if horizon > 0 else 0.0,
            "mean_kv_usage": rep.area_kv / horizon if horizon > 0 else 0.0,
            "mean_batch_size": rep.area_batch / horizon if horizon > 0 else 0.0,
            "prefix_hit_rate": r.prefix_hits / r.prefix_queries if r.prefix_queries else 0.0,
            "preemptions": r.num_preemptions,
            "p50_ttft_s": float(done["ttft_s"].median()) if len(done) else np.nan,
            "p99_ttft_s": float(done["ttft_s"].quantile(0.99)) if len(done) else np.nan,
            "mean_tpot_s": float(done["tpot_s"].mean()) if len(done) else np.nan,
            "p50_e2e_s": float(done["e2e_s"].median()) if len(done) else np.nan,
            "mfu": eng.executor.totals.mfu(eng.model, eng.hardware,
                                           replica_config(built.cfg, i).engine
                                           .tensor_parallel_size),
            "kv_blocks": r.num_blocks,
        })
    return pd.DataFrame(rows)


def cluster_row(built: BuiltCluster, res: ClusterResult, req: pd.DataFrame, steps: pd.DataFrame,
                per: pd.DataFrame, extra: dict[str, Any],
                token_times: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """The summary row of a cluster point (same columns as a single engine's, plus cluster ones)."""
    cfg = built.cfg
    n = len(res.replicas)
    row = summarize(res.total, req, steps, cfg.slo, extra, token_times)
    # summarize's time averages add up the replicas' step logs: per replica, divide by n.
    horizon = res.total.end_time
    sims = built.simulation.replicas
    if "measured_window_s" in row:  # closed loop: summarize averaged the window's steps
        row["mean_kv_usage"] /= n
        row["mean_batch_size"] /= n
    elif horizon > 0:
        row["mean_kv_usage"] = sum(r.area_kv for r in sims) / horizon / n
        row["mean_batch_size"] = sum(r.area_batch for r in sims) / horizon / n
        row["mean_queue_len"] = sum(r.area_waiting for r in sims) / horizon
        row["littles_L"] = sum(r.area_in_system for r in sims) / horizon
    row["num_replicas"] = n
    row["router"] = res.router
    row["load_imbalance"] = imbalance([float(x) for x in res.routed])
    row["busy_imbalance"] = imbalance(res.busy_time)
    row["router_spills"] = res.num_spills
    row["num_prefill_replicas"] = cfg.cluster.num_prefill_replicas
    row["kv_transfer_s_total"] = getattr(built.simulation, "transfer_time", 0.0)

    row.update(beyond_fit([e.executor for e in built.engines]))
    row["mfu"] = float(per["mfu"].mean()) if not per.empty else 0.0
    row["mbu"] = float(np.mean([e.executor.totals.mbu(e.model, e.hardware,
                                                      replica_config(cfg, i).engine
                                                      .tensor_parallel_size)
                                for i, e in enumerate(built.engines)]))
    row["token_throughput_bound"] = sum(e.roofline.max_tokens_per_second() for e in built.engines)
    ls = built.workload.length_stats
    row["overlong_policy"] = ls.policy
    row["overlong_clipped"] = ls.clipped
    row["overlong_dropped"] = ls.dropped
    return row


def cluster_frames(res: ClusterResult, itl: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-request and per-step tables of the whole cluster, each with a replica column."""
    req = requests_frame(res.total, itl)
    if req.empty:
        req["replica"] = pd.Series(dtype=int)
    parts = []
    for i, r in enumerate(res.replicas):
        s = steps_frame(r)
        s.insert(0, "replica", i)
        parts.append(s)
    steps = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return req, steps
