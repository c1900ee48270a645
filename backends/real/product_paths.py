"""Which kernel each few-row CPU product takes, chosen by timing the candidates on this host.

At engine start the candidate paths are timed on the model's own weight shapes for 1..TIMED_ROWS
rows (the projections summed, the LM head apart), the fastest is kept per row count, and the
choice is cached per host (CPU model and flags, torch version, threads) under the cache folder.
`cpu_product_paths` names one path instead. Rows above TIMED_ROWS take the plan's last entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from twinserve.core.errors import InvalidConfigError
from twinserve.backends.real import few_rows

log = logging.getLogger(__name__)

# x @ W_t on a transposed copy; oneDNN's prepacked weights; F.linear (MKL); the few-row kernel.
PATHS = ("transposed", "prepacked", "linear", "blocked")
TIMED_ROWS = 16
# Each cell is the best of this many interleaved rounds: the ratios hold on a busy machine.
ROUNDS = 5
# A row keeps the previous row's path when that is within this share of the best: fewer regime bounds,
# and run noise (5-20% on a shared machine) does not flip rows between paths ~2x apart elsewhere.
TIE = 0.08
CACHE_FILE = "product_paths.json"
# After the first round, a path slower than this times a row's best is not timed again at that row.
CONTENDER = 1.3
# Seconds of timing per call of time_paths (projections, then the head) before rows stop at 2 rounds.
BUDGET_S = 2.0


@dataclass(slots=True)
class ProductPlan:
    """The path of products of r rows: table[r - 1] for r <= TIMED_ROWS, table[-1] above."""

    projections: tuple[str, ...]
    head: tuple[str, ...]
    source: str  # "measured", "cache", "override" or "small_batch_rows"
    timing_s: float = 0.0
    timings_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def paths(self) -> set[str]:
        """Every path some row count takes (the weight copies to keep)."""
        return set(self.projections) | set(self.head)

    def record(self) -> dict[str, list[str]]:
        """What a profile records and fidelity compares."""
        return {"projections": list(self.projections), "head": list(self.head)}

    def small_batch_rows(self) -> int:
        """Rows up to which every projection takes the transposed copy (the legacy record)."""
        n = 0
        while n < TIMED_ROWS and self.projections[n] == "transposed":
            n += 1
        return n


def path_of(table: tuple[str, ...] | list[str], rows: int) -> str:
    """The path of a product of `rows` rows in a plan's table."""
    return table[rows - 1] if 0 < rows <= TIMED_ROWS else table[-1]


# The flags that decide which of torch's and oneDNN's kernels run (named in messages).
_NAMED_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx_ne_convert",
                "amx_tile", "amx_bf16")


def describe_cpu() -> str:
    """The CPU's capability and kernel flags, for messages: 'AVX2 [avx2, fma]'."""
    have = few_rows.cpu_flags()
    named = [f for f in _NAMED_FLAGS if f in have]
    return f"{torch.backends.cpu.get_cpu_capability()} [{', '.join(named) or 'no listed flags'}]"


def unavailable(path: str, dtype: torch.dtype, args: Any) -> str | None:
    """Why `path` cannot run products of `dtype` here with these args (None: it can)."""
    if path == "transposed":
        return None if args.small_batch_weights else "small_batch_weights (off)"
    if path == "prepacked":
        from twinserve.backends.real.models.llama import packed_bf16_supported

        if not args.prepack_weights:
            return "prepack_weights (off)"
        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
            return "oneDNN (this torch has none)"
        if dtype == torch.bfloat16 and not packed_bf16_supported():
            return f"oneDNN's bf16 kernels (AVX512-BF16 or AMX); this CPU has {describe_cpu()}"
        return None
    if path == "blocked":
        if dtype != torch.float32:
            return f"float32 (the kernel is fp32 only; dtype is {str(dtype).removeprefix('torch.')})"
        module, why = few_rows.load()
        return None if module is not None else f"the few-row kernel, which {why}"
    return None  # linear: F.linear runs everywhere


def weight_shapes(cfg: Any) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """([out, in] of a layer's qkv, o, gate_up and down projections], [out, in] of the LM head)."""
    h = cfg.hidden_size
    return ([(cfg.q_size + 2 * cfg.kv_size, h), (h, cfg.q_size), (2 * cfg.intermediate_size, h),
             (h, cfg.intermediate_size)], (cfg.vocab_size, h))


def prepare(path: str, weight: torch.Tensor) -> Any:
    """The copy of an [out, in] weight that `path` multiplies by."""
    if path == "transposed":
        return weight.t().contiguous()
    if path == "prepacked":
        return torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    if path == "blocked":
        return few_rows.load()[0].pack(weight)
    return weight


def product(path: str, x: torch.Tensor, copy: Any, out_features: int) -> torch.Tensor:
    """x times a weight through `path` (no bias), as the model's linear() runs it."""
    if path == "transposed":
        return x @ copy
    if path == "prepacked":
        return torch.ops.mkldnn._linear_pointwise(x, copy, None, "none", [], "")
    if path == "blocked":
        return few_rows.load()[0].mm(x, copy, out_features)
    from twinserve.backends.real.models.llama import _dense

    return _dense(x, copy)


def time_paths(shapes: list[tuple[int, int]], dtype: torch.dtype, paths: list[str],
               rows: range = range(1, TIMED_ROWS + 1), rounds: int = ROUNDS,
               budget_s: float = BUDGET_S) -> dict[str, list[float]]:
    """{path: [best ms of one product per shape, summed, for each row count]}, paths interleaved.

    After the first round only contenders (within CONTENDER of the row's best) are timed again, and
    a row stops after 2 rounds once it has spent its share of budget_s: start-up stays bounded."""
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(o, i, generator=gen) * i ** -0.5).to(dtype) for o, i in shapes]
    copies = {p: [prepare(p, w) for w in weights] for p in paths}
    out: dict[str, list[float]] = {p: [] for p in paths}
    share = budget_s / max(1, len(rows))
    for r in rows:
        xs = [torch.randn(r, i, generator=gen).to(dtype) for _, i in shapes]
        best = dict.fromkeys(paths, float("inf"))
        t_row = time.perf_counter()
        for p in paths:  # warm: oneDNN makes a primitive per shape on first use (the others' count)
            t0 = time.perf_counter()
            for x, c, (o, _) in zip(xs, copies[p], shapes):
                product(p, x, c, o)
            if p != "prepacked":
                best[p] = time.perf_counter() - t0
        for n in range(rounds):
            if n >= 2 and time.perf_counter() - t_row > share:
                break
            floor = min(best.values())
            for p in paths:
                if n and best[p] > floor * CONTENDER:
                    continue  # it cannot win this row: not timed again
                t0 = time.perf_counter()
                for x, c, (o, _) in zip(xs, copies[p], shapes):
                    product(p, x, c, o)
                best[p] = min(best[p], time.perf_counter() - t0)
        for p in paths:
            out[p].append(best[p] * 1e3)
    return out


def smooth(timings: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each row's time as the mean over it and its neighbours: a path's cost changes slowly with rows,
    the noise of one cell does not. One row stays apart (a matrix-vector product, another kernel)."""
    out = {}
    for p, t in timings.items():
        out[p] = [t[0]] + [sum(t[max(1, i - 1):i + 2]) / len(t[max(1, i - 1):i + 2]) for i in range(1, len(t))]
    return out


def choose(timings: dict[str, list[float]], fixed: dict[int, str] | None = None) -> tuple[str, ...]:
    """Per row count the fastest path over smoothed timings (the previous row's within TIE), then the
    fastest at TIMED_ROWS but the blocked kernel (rows above TIMED_ROWS are prefill: torch's GEMMs).
    `fixed` pins row counts to a path."""
    paths = list(timings)
    smoothed = smooth(timings)
    table: list[str] = []
    for i in range(TIMED_ROWS):
        if fixed and i + 1 in fixed:
            table.append(fixed[i + 1])
            continue
        best = min(paths, key=lambda p: smoothed[p][i])
        prev = table[-1] if table else None
        if prev in smoothed and smoothed[prev][i] <= smoothed[best][i] * (1 + TIE):
            best = prev
        table.append(best)
    big = [p for p in paths if p != "blocked"]
    table.append(min(big, key=lambda p: timings[p][-1]) if big else "linear")
    return tuple(table)


def _host_key(cfg: Any, dtype: torch.dtype, paths: list[str], fixed_rows: int) -> str:
    key = {"cpu": few_rows.cpu_model(), "flags": sorted(few_rows.cpu_flags()),
           "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "dtype": str(dtype), "shapes": weight_shapes(cfg),
           "paths": paths, "small_batch_rows": fixed_rows, "rounds": ROUNDS,
           # Another kernel source is another candidate: timed again.
           "kernel": hashlib.sha256(few_rows.SOURCE.read_bytes()).hexdigest()[:12] if "blocked" in paths else None}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, key: str, plan: ProductPlan) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_cache(path)
        data[key] = asdict(plan)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)  # atomic: engines starting together never read half a file
    except OSError as e:
        log.warning("could not cache the product paths in %s: %s", path, e)


def resolve_plan(args: Any, cfg: Any, device: torch.device, dtype: torch.dtype) -> ProductPlan | None:
    """The plan of a CPU engine's products (None: GPU, or CPU bf16 left to its defaults).

    Raises InvalidConfigError when cpu_product_paths names a path this CPU cannot run."""
    choice = getattr(args, "cpu_product_paths", "auto")
    if device.type != "cpu" or (dtype != torch.float32 and choice == "auto"):
        return None
    # An explicit small_batch_rows keeps its meaning: rows up to it take the transposed copy; the
    # rest take the named path, or are timed among the other paths.
    fixed_rows = args.resolve_small_batch_rows(device) if args.small_batch_rows is not None else 0
    if fixed_rows >= TIMED_ROWS:
        table = ("transposed",) * (TIMED_ROWS + 1)
        return ProductPlan(table, table, "small_batch_rows")
    if choice != "auto":
        why = unavailable(choice, dtype, args)
        if why is not None:
            raise InvalidConfigError("cpu_product_paths", choice,
                                     f"'auto' or a path this CPU runs ({', '.join(available(dtype, args))}): "
                                     f"{choice!r} needs {why}")
        above = "linear" if choice == "blocked" else choice
        table = tuple("transposed" if r <= fixed_rows else choice for r in range(1, TIMED_ROWS + 1)) + (above,)
        return ProductPlan(table, table, "override")
    paths = available(dtype, args)
    fixed = {r: "transposed" for r in range(1, fixed_rows + 1)}
    timed = [p for p in paths if p != "transposed"] if fixed_rows else paths
    key = _host_key(cfg, dtype, timed, fixed_rows)
    cache = few_rows.cache_dir() / CACHE_FILE
    hit = _read_cache(cache).get(key)
    if isinstance(hit, dict):
        try:
            return ProductPlan(tuple(hit["projections"]), tuple(hit["head"]), "cache", float(hit["timing_s"]),
                               hit.get("timings_ms") or {})
        except (KeyError, TypeError, ValueError):
            pass  # a damaged entry is measured again
    t0 = time.perf_counter()
    proj_shapes, head_shape = weight_shapes(cfg)
    proj = time_paths(proj_shapes, dtype, timed)
    head = time_paths([head_shape], dtype, timed)
    plan = ProductPlan(choose(proj, fixed), choose(head, fixed), "measured")
    plan.timing_s = time.perf_counter() - t0
    plan.timings_ms = {"projections": proj, "head": head}
    log.info("CPU product paths timed in %.1f s: projections %s, head %s", plan.timing_s,
             compact(plan.projections), compact(plan.head))
    _write_cache(cache, key, plan)
    return plan


def available(dtype: torch.dtype, args: Any) -> list[str]:
    """The paths this CPU runs for `dtype` with these args."""
    return [p for p in PATHS if unavailable(p, dtype, args) is None]


def compact(table: tuple[str, ...] | list[str]) -> str:
    """'1: transposed, 2-16: blocked, >16: prepacked' from a plan's table."""
    parts: list[str] = []
    start = 1
    for r in range(1, TIMED_ROWS + 1):
        if r == TIMED_ROWS or table[r] != table[r - 1]:
            parts.append(f"{start}{'' if start == r else f'-{r}'}: {table[r - 1]}")
            start = r + 1
    parts.append(f">{TIMED_ROWS}: {table[-1]}")
    return ", ".join(parts)


def bf16_slowdown(cfg: Any, rows: tuple[int, ...] = (1, 8)) -> dict[int, float]:
    """{rows: bf16 F.linear time / fp32's fastest path} over the model's projection shapes."""
    proj_shapes, _ = weight_shapes(cfg)
    r = range(min(rows), max(rows) + 1)
    bf16 = time_paths(proj_shapes, torch.bfloat16, ["linear"], rows=r, rounds=3)["linear"]
    fp32 = time_paths(proj_shapes, torch.float32, ["transposed", "linear"], rows=r, rounds=3)
    return {n: bf16[n - r.start] / min(t[n - r.start] for t in fp32.values()) for n in rows}


def warn_slow_bf16(cfg: Any) -> dict[int, float] | None:
    """Warn, with the slowdown timed now, when bf16 runs on a CPU without oneDNN's bf16 kernels."""
    from twinserve.backends.real.models.llama import packed_bf16_supported

    if packed_bf16_supported():
        return None
    slow = bf16_slowdown(cfg)
    log.warning("bf16 on a CPU without bf16 kernels (no AVX512-BF16 or AMX; this CPU has %s): its products "
                "take a generic path (timed now: %s the time of fp32's fastest); --dtype auto (float32) is "
                "faster here",
                describe_cpu(), ", ".join(f"{v:.1f}x at {r} row{'s' * (r > 1)}" for r, v in slow.items()))
    return slow
