"""The study's [kv_offload] table: a host-memory tier behind the device's prefix cache.

    [kv_offload]
    host_size_gib = 64         # host memory for evicted full KV blocks (0: no tier), over the replica's GPUs
    # or: host_blocks = 40000  # the tier in blocks
    eviction = "lru"           # the host tier's eviction: lru, or lrfu (reuse-aware: frequency and recency)
    bandwidth = -1             # host link per direction, bytes/s (-1: the GPU's, backends/sim/catalog.py)
    latency_s = -1             # fixed cost of one transfer (-1: the GPU's)

As vLLM's --kv-offloading-size, host_size_gib is summed over the replica's GPUs: a block takes its
bytes on every GPU that holds a part of it. Each GPU copies its part over its own link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twinserve.core.knobs import knob
from twinserve.core.kv.host_policies import HOST_EVICTION_POLICIES

from twinserve.sim.errors import ConfigError

GiB = 1024 ** 3


def eviction_choices() -> tuple[str, ...]:
    """The host tier's eviction policies, by registered name (the core's registry)."""
    return tuple(HOST_EVICTION_POLICIES)


@dataclass(slots=True)
class KVOffloadSection:
    """A host-memory KV tier: its size, eviction policy and the link it is reached over."""

    host_size_gib: float = knob(0.0, help="host memory for evicted full KV blocks, summed over the "
                                          "replica's GPUs", unit="GiB", range=(0.0, 1e6), open="lo",
                                special={0: "no host tier"})
    host_blocks: int = knob(0, help="the host tier in KV blocks (instead of host_size_gib)", unit="blocks",
                            range=(1, 2 ** 31 - 1), special={0: "from host_size_gib"})
    eviction: str = knob("lru", help="the host tier's eviction policy", choices=eviction_choices)
    bandwidth: float = knob(-1.0, help="host link bandwidth per direction", unit="bytes/s",
                            range=(1e6, 1e15), special={-1: "the GPU's host link, hardware catalog"})
    latency_s: float = knob(-1.0, help="fixed cost of one host transfer", unit="seconds", range=(0.0, 1.0),
                            special={-1: "the GPU's host link, hardware catalog"})

    @property
    def enabled(self) -> bool:
        """True when the study has a host tier."""
        return self.host_size_gib > 0.0 or self.host_blocks > 0

    def describe(self) -> str:
        """One line for the run summary."""
        if not self.enabled:
            return "host KV tier: off"
        size = f"{self.host_blocks} blocks" if self.host_blocks else f"{self.host_size_gib:g} GiB"
        return f"host KV tier: {size}, eviction {self.eviction}"


def check_kv_offload(sec: KVOffloadSection, error: Callable[[str, str], ConfigError]) -> None:
    """Cross-field checks: one way to size the tier."""
    if sec.host_size_gib > 0.0 and sec.host_blocks > 0:
        raise error("host_blocks", f"host_blocks = {sec.host_blocks} and host_size_gib = "
                    f"{sec.host_size_gib:g}: give one of them")


def host_tier_blocks(sec: KVOffloadSection, block_bytes: float, gpus_per_block: int,
                     error: Callable[[str, str], ConfigError]) -> int:
    """Blocks the tier holds: host_blocks, or host_size_gib over a block's bytes on all its GPUs.

    A tier that cannot hold one block is an error (0 when the tier is off).
    """
    if not sec.enabled:
        return 0
    if sec.host_blocks:
        return sec.host_blocks
    one = block_bytes * gpus_per_block
    n = int(sec.host_size_gib * GiB // one)
    if n < 1:
        raise error("host_size_gib", f"{sec.host_size_gib:g} GiB is smaller than one KV block "
                    f"({one / 2**20:.3g} MiB over {gpus_per_block} GPU(s)); give at least "
                    f"{one / GiB:.3g} GiB, or 0 for no host tier")
    return n


def tier_columns(tier: Any, kv: Any, end_time: float) -> dict[str, float]:
    """The summary row's host-tier columns: hits, blocks moved, the link's busy shares.

    tier: the core's HostTierExecutor; kv: the scheduler's KVCacheManager (its host tier's stats).
    """
    st = kv.host.stats
    loads, stores = tier.link.loads, tier.link.stores
    span = end_time if end_time > 0 else float("nan")
    return {"host_tier_blocks": kv.host.num_blocks, "eviction": kv.host.policy_name,
            "host_hit_rate": st.hits / st.queries if st.queries else 0.0,
            "host_blocks_loaded": loads.blocks, "host_blocks_stored": stores.blocks,
            "host_evictions": st.evictions, "host_stores_dropped": st.stores_dropped,
            "link_load_busy": loads.busy_s / span, "link_store_busy": stores.busy_s / span,
            "load_wait_s": tier.wait_s, "copy_stall_s": tier.copy_stall_s}


def store_free_window(sched: Any, k: int) -> int:
    """The most of k fast-forwarded decode steps that evict no cached block (0 to k).

    An evicted block is stored to the host tier at the step that takes it; a window prices no
    copies, so it ends before the first one and stepping runs that step (results stay equal).
    A window takes its new blocks from the free queue's front, in order.
    """
    kv = sched.kv
    bs = kv.block_size
    held = kv.req_to_blocks
    grow = [(req.num_computed_tokens, len(held[req.request_id])) for req in sched.running]

    def needed(steps: int) -> int:
        return sum(max(0, -(-(c + steps) // bs) - n) for c, n in grow)

    want = needed(k)
    clean = 0
    for block in kv.pool.free_queue:
        if clean >= want or block.block_hash is not None or block.pending is not None:
            break
        clean += 1
    if clean >= want:
        return k
    lo, hi = 0, k  # the largest step count whose blocks are all clean
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if needed(mid) <= clean:
            lo = mid
        else:
            hi = mid - 1
    return lo


def window_stores(sched: Any, k: int) -> tuple[list[int], dict[int, int]]:
    """Per step of a k-step decode window, the cached blocks it takes (each a possible store), and
    step by block id. The window takes blocks from the free queue's front in schedule()'s order."""
    kv = sched.kv
    bs = kv.block_size
    held = kv.req_to_blocks
    events = []
    for i, req in enumerate(sched.running):
        s = len(held[req.request_id]) * bs - req.num_computed_tokens
        while s < k:
            events.append((s, i))
            s += bs
    counts = [0] * k
    step_of: dict[int, int] = {}
    if events:
        events.sort()
        for (s, _), block in zip(events, kv.pool.free_queue):
            if block.block_hash is not None or block.pending is not None:  # pending: keyed when evicted
                counts[s] += 1
                step_of[block.block_id] = s
    return counts, step_of


def stores_fit(link: Any, counts: list[int], start: float, durations: list[float]) -> int:
    """Steps of the window whose stores (at most counts[j]) run as stepping runs them: each on an
    idle stream, done within its step (no stall, no queue into the next step)."""
    free = link.store_free
    t = start
    for j, d in enumerate(durations):
        if counts[j]:
            if free > t or link.store_time(counts[j]) > d:
                return j
            free = t + link.store_time(counts[j])
        t += d
    return len(durations)


def price_window_stores(tier: Any, kv: Any, step_of: dict[int, int], starts: list[float]) -> None:
    """The window's stores, taken from the KV manager and priced at the start of the step that made
    each, as stepping prices them (earlier ones, not yet taken, at the window's first step)."""
    stores, loads = kv.take_transfers()
    if loads:
        raise AssertionError("a fast-forwarded window queued host-tier loads")
    per: dict[int, int] = {}
    for block_id, _ in stores:
        j = step_of.get(block_id, 0)
        per[j] = per.get(j, 0) + 1
    for j in sorted(per):
        tier.link.store(per[j], starts[j])
