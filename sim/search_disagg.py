"""Disaggregated configurations for `simulate search`: the prefill/decode splits of a GPU budget.

With `[search] disaggregation = "auto"` and `gpu_budget = G`, every grid point at TP t also
runs as p prefill and d decode replicas of TP t for each p + d = G // t (p, d >= 1), beside
the point itself (aggregated, one replica). Rows compare them per GPU (tokens/s/GPU at the
SLOs), as AIConfigurator compares its agg and disagg candidates.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from twinserve.sim.config import StudyConfig, field_error, replica_config, set_field


def gpus_of(cfg: StudyConfig) -> int:
    """GPUs of one configuration: every replica's TP."""
    return sum(replica_config(cfg, i).engine.tensor_parallel_size
               for i in range(max(1, cfg.cluster.num_replicas)))


def with_modes(base: StudyConfig, points: list[tuple[dict[str, Any], StudyConfig]]
               ) -> list[tuple[dict[str, Any], StudyConfig]]:
    """Each point labelled agg or disagg, plus its splits of the GPU budget under "auto"."""
    sc = base.search
    out: list[tuple[dict[str, Any], StudyConfig]] = []
    for point, cfg in points:
        split = cfg.cluster.num_prefill_replicas
        mode = (f"disagg {split}P+{cfg.cluster.num_replicas - split}D" if split else
                "agg" if cfg.cluster.num_replicas <= 1 else f"agg x{cfg.cluster.num_replicas}")
        if sc.gpu_budget and gpus_of(cfg) > sc.gpu_budget:
            raise field_error(base, "search.gpu_budget",
                              f"the configuration {_name(point)} ({mode}) takes {gpus_of(cfg)} GPUs, "
                              f"more than gpu_budget = {sc.gpu_budget}; shrink the split or raise "
                              "the budget")
        out.append(({**point, "mode": mode}, cfg))
        if sc.disaggregation != "auto" or split:
            continue
        tp = cfg.engine.tensor_parallel_size
        workers = sc.gpu_budget // tp
        for p in range(1, workers):
            c = copy.deepcopy(cfg)
            set_field(c, "cluster.num_replicas", workers)
            set_field(c, "cluster.num_prefill_replicas", p)
            out.append(({**point, "mode": f"disagg {p}P+{workers - p}D"}, c))
    return out


def split_of(point: dict[str, Any]) -> tuple[int, int] | None:
    """(prefill, decode) replicas of a point's mode "disagg PP+DD" (None for agg)."""
    m = re.fullmatch(r"disagg (\d+)P\+(\d+)D", str(point.get("mode", "")))
    return (int(m.group(1)), int(m.group(2))) if m else None


def neighbour_splits(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when b is a's split of the same GPUs with one replica moved between prefill and decode
    (every other grid value the same)."""
    sa, sb = split_of(a), split_of(b)
    if sa is None or sb is None or sum(sa) != sum(sb) or abs(sa[0] - sb[0]) != 1:
        return False
    return all(b.get(k) == v for k, v in a.items() if k != "mode") and len(a) == len(b)


def check_disaggregation(base: StudyConfig) -> None:
    """"auto" needs a GPU budget to split."""
    sc = base.search
    if sc.disaggregation == "auto" and sc.gpu_budget < 2:
        raise field_error(base, "search.disaggregation",
                          f'"auto" splits search.gpu_budget GPUs into prefill and decode replicas; '
                          f"set gpu_budget >= 2 (it is {sc.gpu_budget})")


def _name(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items()) or "(base)"
