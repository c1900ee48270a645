"""A 1/g slice of a row's cluster: R/g replicas and N/g clients, the same per-client workload.

A disaggregated row runs P identical prefill workers and D identical decode workers behind a
least-outstanding router, each with its own KV pool, and a KV link priced per transfer (no shared
link: sim/disagg.py). N closed-loop clients spread over them evenly, so each worker sees about N/D
(N/P) clients whatever g is; a slice of P/g prefill and D/g decode workers with N/g clients sees
the same per-worker load, and its per-request TTFT/TPOT distribution is the full cluster's up to
routing noise and the sampled lengths. g is the largest common divisor of P, D and N (every slice
keeps at least one worker of each kind and whole clients). The engine's own settings
(max_num_seqs sized for the full N, the step budget) stay as the full row's.

Attention-DP ranks are NOT sliced: they live in one engine (sim/build.py: one scheduler, ranks in
lock step, the MoE exchange priced over tp x dp GPUs), so fewer ranks price a different step.
docs/validate-speed.md compares reduced with full runs on development rows.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

REPLICAS = "replicas"
NONE = "none"
REDUCTIONS = (REPLICAS, NONE)
# Off until the development rows' comparison (docs/validate-speed.md) says otherwise.
DEFAULT_REDUCTION = NONE


@dataclass(frozen=True, slots=True)
class Slice:
    """How a row's study was sliced: factor g, and the clients/workers simulated of the full row's."""

    factor: int = 1
    clients: int = 0
    prefill: int = 0
    decode: int = 0

    def label(self) -> str:
        """validation.csv's `reduction`: '' when not reduced, else e.g. '1/4: P 1 D 2, 512 clients'."""
        if self.factor <= 1:
            return ""
        return f"1/{self.factor}: P {self.prefill} D {self.decode}, {self.clients} clients"


def slice_factor(cfg: Any, concurrency: int) -> int:
    """g: the largest divisor of the prefill and decode worker counts and the clients (1: not reducible).

    Only a disaggregated cluster whose prefill replicas are alike and whose decode replicas are
    alike is sliced; a single engine (aggregated rows, attention DP inside it) gives 1.
    """
    c = cfg.cluster
    pre, total = int(c.num_prefill_replicas), int(c.num_replicas)
    dec = total - pre
    if pre < 1 or dec < 1 or concurrency < 1 or total < 3:
        return 1
    layouts = list(c.replicas)
    if len(layouts) != total:
        return 1
    if any(layouts[i] != layouts[0] for i in range(pre)) or any(layouts[i] != layouts[pre] for i in range(pre, total)):
        return 1  # unlike workers of one kind: a slice would not be a fair sample
    return math.gcd(math.gcd(pre, dec), int(concurrency))


def reduce_study(cfg: Any, concurrency: int, factor: int) -> Any:
    """A copy of cfg with 1/factor of its prefill and decode replicas and of its clients and requests.

    The workload's requests per client stay the same (num_requests and warmup_requests / factor);
    ValueError when factor does not divide the workers, the clients and the requests.
    """
    c = cfg.cluster
    pre, total = int(c.num_prefill_replicas), int(c.num_replicas)
    dec = total - pre
    w = cfg.workload
    warm, num = int(getattr(w, "warmup_requests", 0) or 0), int(w.num_requests)
    for name, v in (("prefill replicas", pre), ("decode replicas", dec), ("clients", concurrency),
                    ("num_requests", num), ("warmup_requests", warm)):
        if factor < 1 or v % factor:
            raise ValueError(f"reduce_study: factor {factor} does not divide {name} ({v})")
    out = copy.deepcopy(cfg)
    oc = out.cluster
    oc.num_prefill_replicas = pre // factor
    oc.num_replicas = pre // factor + dec // factor
    oc.replicas = list(c.replicas[:pre // factor]) + list(c.replicas[pre:pre + dec // factor])
    ow = out.workload
    setattr(ow, "concurrency", concurrency // factor)
    setattr(ow, "warmup_requests", warm // factor)
    ow.num_requests = num // factor
    return out


def slice_row(cfg: Any, concurrency: int, reduction: str) -> tuple[Any, Slice]:
    """(the study to simulate, its Slice) under `reduction` ('replicas' or 'none')."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r}: allowed {', '.join(REDUCTIONS)}")
    g = slice_factor(cfg, concurrency) if reduction == REPLICAS else 1
    if g <= 1 or not hasattr(cfg.workload, "concurrency"):
        return cfg, Slice()
    c = cfg.cluster
    pre = int(c.num_prefill_replicas)
    return reduce_study(cfg, concurrency, g), Slice(g, concurrency // g, pre // g, (int(c.num_replicas) - pre) // g)
