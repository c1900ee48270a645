"""Facts of the machine and engine a step profile depends on: device name, CPU kernel features, and
the token counts where the engine switches code path (the fit's regime bounds).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any


def _cpuinfo(key: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def device_name(device: Any) -> str:
    """A human name for the device the engine runs on."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu: " + (_cpuinfo("model name") or platform.processor() or platform.machine())


# Flags that choose torch's kernels (bf16 without AVX512-BF16/AMX takes a far slower generic
# path; VNNI serves int8); a VM's model name does not tell them apart.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                "amx_tile", "amx_bf16", "amx_int8")


def cpu_features() -> dict[str, Any]:
    """{"capability": torch's CPU kernel level, "flags": the KERNEL_FLAGS present, None off x86 Linux}."""
    import torch

    got = _cpuinfo("flags")
    have = set(got.split()) if got is not None else None
    return {"capability": torch.backends.cpu.get_cpu_capability(),
            "flags": [f for f in KERNEL_FLAGS if f in have] if have is not None else None}


def product_plan(args: Any, cfg: Any) -> Any:
    """The CPU product plan an engine with these args runs (product_paths.resolve_plan: cached per host)."""
    from twinserve.backends.real.product_paths import resolve_plan

    device = args.resolve_device()
    return resolve_plan(args, cfg, device, args.resolve_dtype(device))


def engine_product_plan(engine: Any) -> Any:
    """The plan an engine's in-process worker runs; else the host's cached plan for its args."""
    worker = getattr(engine, "worker", None)
    if worker is not None and hasattr(worker, "product_plan"):
        return worker.product_plan
    return product_plan(engine.args, engine.model_config)


def plan_bounds(record: dict[str, list[str]]) -> list[int]:
    """Row counts after which a product plan's path changes (and F.linear's padded 9-15 rows)."""
    from twinserve.backends.real.models.llama import PAD_MIN_ROWS, PAD_ROWS

    proj, head = record["projections"], record["head"]
    bounds = {r for r in range(1, len(proj)) if proj[r - 1] != proj[r] or head[r - 1] != head[r]}
    # Products of PAD_MIN_ROWS..PAD_ROWS-1 rows through F.linear cost what PAD_ROWS rows cost.
    if PAD_ROWS and any(proj[r - 1] == "linear" for r in range(PAD_MIN_ROWS, min(PAD_ROWS, len(proj)))):
        bounds |= {PAD_MIN_ROWS - 1, PAD_ROWS - 1}
    return sorted(bounds)


def regime_bounds(engine: Any) -> list[int]:
    """Token counts where the engine switches code path (CPU fp32: the product plan, padding)."""
    plan = engine_product_plan(engine)
    if plan is not None:
        return plan_bounds(plan.record())
    device = engine.args.resolve_device()
    return _code_path_bounds(device.type, str(engine.args.resolve_dtype(device)),
                             engine.args.resolve_small_batch_rows(device), engine_pad_rows(engine))


# The legacy name of a plan's path above TIMED_ROWS rows, as profiles before plans recorded it.
_LEGACY_PATH = {"prepacked": "onednn-prepacked", "linear": "sgemm", "transposed": "sgemm", "blocked": "blocked"}


def fp32_product_path(args: Any, plan: Any = None) -> str | None:
    """The kernel CPU fp32 products above the plan's timed rows run on: 'onednn-prepacked' or 'sgemm'
    (None: not CPU fp32). Without a plan (a caller with no model config), the vendor rule of old."""
    from twinserve.backends.real.models.llama import fp32_prepack_preferred

    device = args.resolve_device()
    if device.type != "cpu" or str(args.resolve_dtype(device)).removeprefix("torch.") != "float32":
        return None
    if plan is not None:
        return _LEGACY_PATH[plan.projections[-1]]
    return "onednn-prepacked" if args.prepack_weights and fp32_prepack_preferred() else "sgemm"


def engine_pad_rows(engine: Any) -> int:
    """The rows F.linear pads few-row products to in this engine (0: it pads none)."""
    from twinserve.backends.real.models.llama import PAD_MIN_ROWS, PAD_ROWS

    plan = engine_product_plan(engine)
    if plan is not None:  # F.linear pads only the rows its plan gives it
        return PAD_ROWS if any(p == "linear" for p in plan.projections[PAD_MIN_ROWS - 1:PAD_ROWS - 1]) else 0
    return _pad_rows()


def _code_path_bounds(device_type: str, dtype: str, small_rows: int, pad_rows: int = 0) -> list[int]:
    """small_rows: products of at most this many rows take the transposed weight copies (0: none)."""
    from twinserve.backends.real.models.llama import PAD_MIN_ROWS

    if device_type != "cpu" or dtype.replace("torch.", "") != "float32":
        return []
    bounds = [small_rows] if small_rows else []
    # Padded products of PAD_MIN_ROWS..pad_rows-1 rows cost what pad_rows rows cost.
    lo = max(PAD_MIN_ROWS, small_rows + 1)
    if pad_rows and lo < pad_rows:
        bounds += [lo - 1, pad_rows - 1]
    return sorted(set(bounds))


def _pad_rows() -> int:
    from twinserve.backends.real.models.llama import PAD_ROWS

    return PAD_ROWS


def graph_max_decodes(device_type: str, enforce_eager: bool, attention_backend: str | None,
                      max_num_seqs: int) -> int | None:
    """The largest decode batch replayed from a CUDA graph, or None when the engine runs eagerly."""
    from twinserve.backends.real.attention import backend_name
    from twinserve.backends.real.cuda_graphs import graph_buckets

    # Only the Triton backend's launches are graph-safe.
    if device_type != "cuda" or enforce_eager or backend_name(attention_backend, device_type) != "triton":
        return None
    return graph_buckets(max_num_seqs)[-1]
