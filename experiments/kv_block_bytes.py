"""Simulator memory per KV block: the figure behind sim.build.BLOCK_BYTES (docs/cluster.md).

Builds one replica's engine (its KV pool is a list of block objects) for two models and
prints the bytes tracemalloc sees per block, and the build time.

    python experiments/kv_block_bytes.py
"""

from __future__ import annotations

import time
import tracemalloc

from twinserve.sim.build import build_engine
from twinserve.sim.config import StudyConfig


def main() -> None:
    """Print bytes per block for Llama-2-7B on A100-80GB and SmolLM2-135M on H200."""
    for model, hardware in (("Llama-2-7B", "A100-80GB"), ("SmolLM2-135M", "H200")):
        cfg = StudyConfig()
        cfg.engine.model, cfg.engine.hardware = model, hardware
        tracemalloc.start()
        t = time.perf_counter()
        eng = build_engine(cfg)
        wall = time.perf_counter() - t
        used, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        blocks = eng.capacity.num_blocks
        print(f"{model} on {hardware}: {blocks:,} blocks, {used / blocks:.0f} B a block, "
              f"{used / 2**20:.1f} MiB a replica, built in {wall:.2f} s")
        del eng


if __name__ == "__main__":
    main()
