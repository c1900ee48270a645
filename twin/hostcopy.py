"""The host KV tier's copies timed on this machine, for `twinserve calibrate` and the forecast.

Stores copy device blocks to host slots, loads the other way, as the engine does
(backends/real/host_kv.py): one tensor per layer's K and V, blocks gathered by id. Copies of n = 1..64 blocks are timed and
fitted as latency + n x block_bytes / bandwidth per direction. On CPU both sides are host memory
(the engine's pool and tier are separate tensors); on CUDA the host side is pinned and the copy
waits for the stream. The fit goes in the profile as "host_link" (backends/sim/host_link.py reads it).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

COUNTS = (1, 2, 4, 8, 16, 32, 64)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of seconds against block count; both held >= 0."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else my / max(mx, 1)
    slope = max(slope, 1e-15)
    return max(my - slope * mx, 0.0), slope


def time_host_copies(num_layers: int, page_elems: int, dtype: Any = None, device: Any = "cpu",
                     counts: tuple[int, ...] = COUNTS, repeats: int = 5) -> dict[str, Any]:
    """Time loads and stores of KV blocks between a device pool and a host tier; the fitted link.

    num_layers x 2 pages (K and V) of page_elems elements make one block.
    """
    import torch

    dtype = dtype or torch.float32
    device = torch.device(device)
    blocks = 2 * max(counts)
    pin = device.type == "cuda"
    # As backends/real/host_kv.py: a host tensor per device KV tensor (K and V of each layer), blocks first.
    pool = [torch.zeros((blocks, page_elems), dtype=dtype, device=device) for _ in range(2 * num_layers)]
    host = [torch.zeros((blocks, page_elems), dtype=dtype, pin_memory=pin) for _ in range(2 * num_layers)]
    block_bytes = 2 * num_layers * page_elems * pool[0].element_size()
    sync = torch.cuda.synchronize if pin else (lambda: None)
    out: dict[str, Any] = {"block_bytes": block_bytes, "device": str(device), "counts": list(counts)}
    for name in ("store", "load"):
        pts = []
        for n in counts:
            ids = torch.arange(0, 2 * n, 2, device=device)  # every other block: a gather, as in the engine
            slots = torch.arange(n)
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                for dev, h in zip(pool, host):
                    if name == "store":
                        h.index_copy_(0, slots, dev.index_select(0, ids).to("cpu", non_blocking=pin))
                    else:
                        dev.index_copy_(0, ids, h.index_select(0, slots).to(device, non_blocking=pin))
                sync()
                times.append(time.perf_counter() - t0)
            pts.append((n, statistics.median(times[1:])))  # the first warms the allocator
        latency, per_block = fit_line(pts)
        out[name] = {"bandwidth": block_bytes / per_block, "latency_s": latency,
                     "seconds": [round(s, 9) for _, s in pts]}
    return out
