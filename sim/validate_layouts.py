"""Worker layouts a measured row leaves out, filled in under one declared assumption and flagged.

aiconfigurator-core's InferenceMAX dumps (`source_file=2026-03-25.csv` / `2026-04-06.csv`) give a
disaggregated row's prefill and decode layouts (TP, attention DP, MoE TP x EP) but not how many
workers of each ran. `simulate validate` expresses them under one assumption, named in the row's
`layout` column and counted apart in summary.json, so the headline figures stay honest. The
assumption is sized from the row's own columns and this simulator's memory model and roofline,
never from the row's measured TTFT or TPOT.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from twinserve.core.errors import TwinserveError


class NotExpressible(TwinserveError, ValueError):
    """A row the simulator cannot express; its message is the reason written to the CSV."""

# How a row's missing prefill/decode worker counts are filled in (docs/validate-rows.md compares them on
# the development rows; the default is the one chosen there):
#   entry:       where InferenceX's matrix holds entries of the row's configuration and shape but none is the
#                row's alone, the one validate_inferencex.assumed_entry picks (its workers, layouts and MTP);
#                elsewhere kv_fit_rate's counts;
#   one_each:    one prefill and one decode worker (1P1D);
#   kv_fit:      the fewest decode workers whose KV pools hold every client at ISL + OSL, one prefill worker;
#   kv_fit_rate: those decode workers, and enough prefill workers that prefill is at most PREFILL_BUSY
#                busy at the rate the decode workers finish requests.
ENTRY = "entry"
DISAGG_ASSUMPTIONS = (ENTRY, "kv_fit_rate", "kv_fit", "one_each")
DEFAULT_DISAGG_ASSUMPTION = ENTRY
PREFILL_BUSY = 0.8  # a prefill worker's share of busy time at the assumed layout: queueing stays short


@dataclass(slots=True, frozen=True)
class AssumedWorkers:
    """Worker counts filled in for a row, and how."""

    prefill: int
    decode: int
    how: str

    def note(self) -> str:
        """The `layout` column's text, e.g. 'assumed kv_fit_rate: 3 prefill, 2 decode workers'."""
        return f"assumed {self.how}: {self.prefill} prefill, {self.decode} decode workers"


def missing_worker_counts(row: pd.Series) -> bool:
    """True for a disaggregated row without its prefill/decode worker counts."""
    if row.get("mode") != "disagg":
        return False
    return any(not _given(row.get(f"{k}_num_workers")) for k in ("prefill", "decode"))


def _given(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def inferred_attention_dp(row: pd.Series) -> int | None:
    """Attention DP of an aggregated row that leaves it empty, from vLLM's rule moe_tp x moe_ep = tp x dp.

    vLLM lays an MoE model's experts over every DP x TP rank (sharded, or split by
    --enable-expert-parallel), so a row giving tp, moe_tp and moe_ep but no attention_dp_size
    determines it. None when the row gives it, or the product is not a whole multiple of tp.
    """
    if row.get("mode") == "disagg" or _given(row.get("attention_dp_size")):
        return None
    vals = [row.get(c) for c in ("tp_size", "moe_tp_size", "moe_ep_size")]
    if not all(_given(v) and v >= 1 for v in vals):
        return None
    tp, moe_tp, moe_ep = (int(v) for v in vals)
    if moe_tp * moe_ep <= tp or (moe_tp * moe_ep) % tp:
        return None
    return moe_tp * moe_ep // tp


def aggregated_layout(row: pd.Series) -> tuple[int, int, int, int]:
    """(tp, attention_dp, moe_tp, moe_ep) of an aggregated row's one worker: folded_layout or vllm_tp_ep_layout
    where one applies, else the row's own sizes (empty or 0: 1) with attention DP by vLLM's rule where the row
    leaves it empty."""
    fold = folded_layout(row) or vllm_tp_ep_layout(row)
    if fold:
        return fold

    def size(col: str) -> int:
        v = row.get(col)
        return int(v) if _given(v) and int(v) >= 1 else 1
    return (size("tp_size"), inferred_attention_dp(row) or size("attention_dp_size"), size("moe_tp_size"),
            size("moe_ep_size"))


# GPUs one aggregated InferenceX server runs on: an 8-GPU node, or a GB200/GB300 NVLink rack of 72.
NODE_GPUS = {"gb200": 72, "gb300": 72}
NODE_GPUS_DEFAULT = 8


def folded_layout(row: pd.Series) -> tuple[int, int, int, int] | None:
    """(tp, attention_dp, moe_tp, moe_ep) of an aggregated row whose tp_size (or attention_dp_size) is
    moe_tp x moe_ep past a node.

    InferenceX's dumps write an EP server's size twice: `tp 8, ep 8` on 8 GPUs becomes tp_size 64,
    moe_tp_size 8, moe_ep_size 8, i.e. a 64-GPU tensor-parallel group for a single-node aggregated
    server. Such a row is read as TP moe_tp with the experts split moe_ep ways over the same GPUs
    (MoE TP 1). The attention-DP form (tp 1, attention_dp_size 64 = moe_tp 8 x moe_ep 8; 16 = 4 x 4)
    is read as one node's attention DP moe_ep x EP moe_ep. Chosen on the development rows
    (docs/validate-accuracy.md); None for any other row.
    """
    if row.get("mode") == "disagg":
        return None
    vals = [row.get(c) for c in ("tp_size", "moe_tp_size", "moe_ep_size")]
    if not all(_given(v) and v >= 1 for v in vals):
        return None
    tp, moe_tp, moe_ep = (int(v) for v in vals)
    adp_v = row.get("attention_dp_size")
    adp = int(adp_v) if _given(adp_v) and adp_v >= 1 else 1
    node = NODE_GPUS.get(str(row.get("system")), NODE_GPUS_DEFAULT)
    # Attention-DP rows past a node: with the benchmark's clients (validate_rows.prepare_rows; before,
    # one rank's batch_size was taken for all of them and folding looked worse) the decode step of the
    # 27 development rows at attention_dp 16 and 64 goes from +63% / +99% (B200) and +7% (H200) over
    # the measured TPOT to -4% / +21% and -10%, beside +15% / -10% for the one-node attention DP 8 rows
    # (experiments/step_probe.py's mean field, aic, 2026-12-05).
    if adp > 1:
        if tp == 1 and adp == moe_tp * moe_ep and adp > node and 2 <= moe_ep <= node:
            return 1, moe_ep, 1, moe_ep
        return None
    if moe_tp < 2 or moe_ep < 2 or tp != moe_tp * moe_ep or tp <= node or moe_tp > node:
        return None
    return moe_tp, 1, 1, moe_ep


def vllm_tp_ep_layout(row: pd.Series) -> tuple[int, int, int, int] | None:
    """(T, 1, 1, T) of an aggregated vLLM row written tp_size T, attention_dp_size T, moe_tp_size 1,
    moe_ep_size T x T (T >= 2): one server of T GPUs, tensor parallel T, its experts split T ways.

    The dumps write InferenceX's matrix entry `tp: T, ep: T` this way for vLLM (2026-04-06.csv and
    db-dump/2026-04-27: MiniMax-M2.5 on B200, B300, H100 and Kimi-K2.5 on B200 at T = 2, 4), the
    entry's size twice as folded_layout's rows do: 2026-04-06.csv names these rows `..._tpT_epT_...`, and
    each of its 40 has a 2026-03-25.csv row of the same model, system, precision, ISL/OSL, clients and
    image written tp_size T, attention DP 1, moe_tp 1, moe_ep T (`..._tpT_0_epT_0_...`). The run was T GPUs:
    - SemiAnalysisAI/InferenceX .github/workflows/benchmark-tmpl.yml @00983c3 passes the entry's tp, ep
      and dp-attn as TP, EP_SIZE, DP_ATTENTION and counts GPU_COUNT = TP x PP x PCP (EP and DP add none).
    - The scripts launch `vllm serve --tensor-parallel-size=$TP`, with --enable-expert-parallel where
      EP_SIZE > 1 and no DP flag: benchmarks/single_node/minimaxm2.5_fp8_b300.sh @5632483,
      fixed_seq_len/minimaxm2.5_fp8_b200.sh @8eec0d4 (SemiAnalysisAI/InferenceX#947's diff, merged
      2026-04-03 with the v0.19.0 image and the `tp: 2, ep: 2` / `tp: 4, ep: 4` entries, the same),
      minimaxm2.5_fp8_h100.sh @34bc7c4 (nvidia-master.yaml @0004cf5: `{ tp: 4, ep: 4, ... }`).
    - vLLM with --enable-expert-parallel splits the experts over all TP x DP ranks, unsharded
      (vllm-project/vllm vllm/model_executor/layers/fused_moe/config.py @002d607,
      FusedMoEParallelConfig.make: `ep_size = tp_size` after flattening TP across DP, MoE tp_size 1).
    Attention is read as TP T, as the entry and the 2026-03-25.csv twins give it. Not told apart by the
    row's columns: the FP4 scripts (minimaxm2.5_fp4_b300.sh @5632483, fixed_seq_len/minimaxm2.5_fp4_b200.sh
    @45c4f91) run an entry with `dp-attn: true` as `--tensor-parallel-size=1 --data-parallel-size=$TP
    --enable-expert-parallel`, the same T GPUs and EP T with attention DP T; the dumps write both alike.
    None for any other row.
    """
    if row.get("mode") == "disagg" or str(row.get("backend")) != "vllm":
        return None
    vals = [row.get(c) for c in ("tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")]
    if not all(_given(v) for v in vals):
        return None
    tp, adp, moe_tp, moe_ep = (int(v) for v in vals)
    if tp < 2 or adp != tp or moe_tp != 1 or moe_ep != tp * tp:
        return None
    return tp, 1, 1, tp


def decode_slots(cfg: Any, isl: int, osl: int) -> int:
    """Clients one decode worker of cfg's [engine] layout holds at ISL + OSL tokens (its KV pool)."""
    from twinserve.sim.build import build_cost_models, engine_capacity
    model, hw, _, _ = build_cost_models(cfg)
    cap = engine_capacity(cfg, model, hw)
    per_seq = math.ceil((isl + osl) / cfg.scheduler.block_size)
    return max(cap.num_blocks // per_seq, 0)


def assume_workers(cfg: Any, prefill_layout: dict[str, Any], decode_layout: dict[str, Any], clients: int,
                   isl: int, osl: int, how: str = DEFAULT_DISAGG_ASSUMPTION) -> AssumedWorkers:
    """Prefill and decode worker counts for a row without them, under assumption `how`.

    cfg is the row's study (engine, scheduler); the layouts are each worker's [engine] fields.
    Sized with the roofline whatever the cost model, so both backends judge the same layout.
    """
    if how not in DISAGG_ASSUMPTIONS:
        raise ValueError(f"disaggregation assumption {how!r}: one of {', '.join(DISAGG_ASSUMPTIONS)}")
    if how == ENTRY:  # no entry of the row's shape: its counts as kv_fit_rate's
        how = "kv_fit_rate"
    if how == "one_each":
        return AssumedWorkers(1, 1, how)
    dec = _with_layout(cfg, decode_layout)
    try:
        slots = decode_slots(dec, isl, osl)
    except TwinserveError as e:  # the weights alone overflow the worker: say which worker, not a study fix
        why = str(e).split("KV blocks: ", 1)[-1].split("; ", 1)[0]
        raise NotExpressible(f"assumed layout {how}: the row's decode worker ({_label(decode_layout)}) does not "
                             f"hold the model in this memory model ({why})") from None
    if slots < 1:
        raise NotExpressible(f"assumed layout {how}: one decode worker ({_label(decode_layout)}) holds no "
                             f"client at {isl} + {osl} tokens in this memory model")
    decode = math.ceil(clients / slots)
    if how == "kv_fit":
        return AssumedWorkers(1, decode, how)
    per_worker = math.ceil(clients / decode)
    t_dec = _roofline(dec).step_time(0, 0, 0, 0.0, per_worker, per_worker * (isl + osl // 2))
    rate = clients / (osl * t_dec)  # requests/s the decode side finishes (TTFT left out: an upper bound)
    pre = _with_layout(cfg, prefill_layout)
    t_pre = _roofline(pre).step_time(isl, 1, 0, isl * (isl + 1) / 2, 0, 0)
    return AssumedWorkers(max(1, math.ceil(rate * t_pre / PREFILL_BUSY)), decode, how)


def _with_layout(cfg: Any, layout: dict[str, Any]) -> Any:
    """A one-replica copy of cfg with a worker's [engine] fields."""
    out = copy.copy(cfg)
    out.engine = copy.copy(cfg.engine)
    out.engine.cost_model = "roofline"  # the same layout whatever the row is priced with
    for dotted, v in layout.items():
        section, name = dotted.split(".", 1)
        setattr(getattr(out, section), name, v)
    return out


def _roofline(cfg: Any) -> Any:
    from twinserve.sim.build import build_cost_models
    return build_cost_models(cfg)[2]


def _label(layout: dict[str, Any]) -> str:
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in layout.items())
