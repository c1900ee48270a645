"""The GPU's link to host memory: the host KV tier's loads and stores, priced as DMA copies.

Each direction is its own copy stream (PCIe and NVLink-C2C are full duplex): transfers queue in
order, each taking latency + bytes / bandwidth, and run beside the compute stream, as an engine
with pinned host memory and copies on their own CUDA streams runs them. HostTierExecutor runs a
step's transfers (SchedulerOutput.kv_stores / kv_loads) on the link around the simulated executor
and reports each load job once its copy is done (ModelRunnerOutput.finished_loads).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Mapping

from twinserve.core.errors import InvalidConfigError
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput


@dataclass(slots=True)
class LinkTotals:
    """What crossed the link in one direction over a run."""

    transfers: int = 0
    blocks: int = 0
    bytes: float = 0.0
    busy_s: float = 0.0


class HostLink:
    """Two FIFO copy streams (host to device: loads; device to host: stores) over one link."""

    def __init__(self, bandwidth: float, latency_s: float, block_bytes: float,
                 store_bandwidth: float | None = None, store_latency_s: float | None = None) -> None:
        store_bandwidth = bandwidth if store_bandwidth is None else store_bandwidth
        store_latency_s = latency_s if store_latency_s is None else store_latency_s
        for name, v in (("bandwidth", bandwidth), ("bandwidth", store_bandwidth)):
            if not v > 0.0:
                raise InvalidConfigError(name, v, "a host link bandwidth > 0 (bytes/s)")
        for name, v in (("latency_s", latency_s), ("latency_s", store_latency_s)):
            if not v >= 0.0:
                raise InvalidConfigError(name, v, "a host link latency >= 0 (seconds)")
        if not block_bytes > 0.0:
            raise InvalidConfigError("block_bytes", block_bytes, "bytes per KV block > 0")
        self.bandwidth = bandwidth  # loads (host to device); stores may differ (a measured link)
        self.latency_s = latency_s
        self.store_bandwidth = store_bandwidth
        self.store_latency_s = store_latency_s
        self.block_bytes = block_bytes
        # When each stream is next free.
        self.load_free = 0.0
        self.store_free = 0.0
        self.loads = LinkTotals()
        self.stores = LinkTotals()

    def transfer_time(self, num_blocks: int) -> float:
        """Seconds one host-to-device copy of num_blocks blocks takes on an idle stream."""
        return self.latency_s + num_blocks * self.block_bytes / self.bandwidth

    def load(self, num_blocks: int, now: float) -> float:
        """Queue a host-to-device copy at now; returns when it completes."""
        d = self.transfer_time(num_blocks)
        done = (self.load_free if self.load_free > now else now) + d
        self.load_free = done
        _count(self.loads, num_blocks, num_blocks * self.block_bytes, d)
        return done

    def store_time(self, num_blocks: int) -> float:
        """Seconds one device-to-host copy of num_blocks blocks takes on an idle stream."""
        return self.store_latency_s + num_blocks * self.block_bytes / self.store_bandwidth

    def store(self, num_blocks: int, now: float) -> float:
        """Queue a device-to-host copy at now; returns when it completes."""
        d = self.store_time(num_blocks)
        done = (self.store_free if self.store_free > now else now) + d
        self.store_free = done
        _count(self.stores, num_blocks, num_blocks * self.block_bytes, d)
        return done


def _count(t: LinkTotals, blocks: int, nbytes: float, seconds: float) -> None:
    t.transfers += 1
    t.blocks += blocks
    t.bytes += nbytes
    t.busy_s += seconds


def host_link_from_profile(meta: Mapping[str, Any], source: str = "<profile>") -> dict[str, float] | None:
    """A profile's measured host link (`twinserve calibrate`, twin/hostcopy.py), or None: load and store
    bandwidth and latency, and the block bytes it was timed on."""
    raw = meta.get("host_link")
    if raw is None:
        return None
    try:
        out = {"block_bytes": float(raw["block_bytes"]),
               "load_bandwidth": float(raw["load"]["bandwidth"]), "load_latency_s": float(raw["load"]["latency_s"]),
               "store_bandwidth": float(raw["store"]["bandwidth"]),
               "store_latency_s": float(raw["store"]["latency_s"]),
               # Where it was timed: a CPU engine copies synchronously, before its forward.
               "synchronous": str(raw.get("device", "cpu")).startswith("cpu")}
    except (KeyError, TypeError, ValueError):
        raise InvalidConfigError("host_link", raw, f"{source}: an object with block_bytes and load/store "
                                 "bandwidth and latency_s (as `twinserve calibrate` writes it)") from None
    if not (out["block_bytes"] > 0 and out["load_bandwidth"] > 0 and out["store_bandwidth"] > 0):
        raise InvalidConfigError("host_link", raw, f"{source}: positive block_bytes and bandwidths")
    return out


class HostTierExecutor:
    """The core's executor when a host tier is on: the step's copies on the link, the step on `inner`.

    Stores (device to host) start with the step; the forward overwrites their blocks, so the step
    ends no sooner than they do. Loads (host to device) queue on their own stream after this step's
    stores (a load may fill a block just stored): the requests they serve wait, the others compute.
    A load is reported at the end of the step in which it completes; a step with nothing to compute
    lasts until the next load completes. The world sets `now` to each step's start.

    synchronous: the engine copies before the forward and waits (twinserve's CPU engine,
    backends/real/host_kv.py): the step lasts its stores, its loads and its compute, and every
    load is done by its end.
    """

    def __init__(self, inner: Any, link: HostLink, synchronous: bool = False) -> None:
        self.inner = inner
        self.link = link
        self.synchronous = synchronous
        self.now = 0.0
        self.pending: list[tuple[float, int]] = []  # (completion time, job id), earliest first
        self.wait_s = 0.0  # steps spent with nothing to compute but loads in flight
        self.copy_stall_s = 0.0  # step time added by copies: stores outlasting the forward, or synchronous copies

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Queue the step's stores and loads, run the step, report the loads done by its end."""
        if self.synchronous:
            return self._execute_synchronous(so)
        now = self.now
        link = self.link
        ready = now
        if so.kv_stores:
            ready = link.store(len(so.kv_stores), now)
        pending = self.pending
        for job_id, pairs in so.kv_loads.items():
            heapq.heappush(pending, (link.load(len(pairs), ready), job_id))
        if so.is_empty and pending:
            state = self.inner.state  # what the inner executor would drop
            for rid in so.finished_req_ids:
                state.pop(rid, None)
            for rid in so.preempted_req_ids:
                state.pop(rid, None)
            d = max(pending[0][0], ready) - now
            self.wait_s += d
            out = ModelRunnerOutput({}, step_time=d)
        else:
            out = self.inner.execute(so)
            d = out.step_time or 0.0
            if ready - now > d:
                self.copy_stall_s += ready - now - d
                out.step_time = d = ready - now
        end = now + d
        if pending and pending[0][0] <= end:
            done = []
            while pending and pending[0][0] <= end:
                done.append(heapq.heappop(pending)[1])
            out.finished_loads = done
        return out

    def _execute_synchronous(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Copies first, then the forward: one after the other on one clock."""
        link = self.link
        copies = link.store(len(so.kv_stores), self.now) - self.now if so.kv_stores else 0.0
        for pairs in so.kv_loads.values():
            copies += link.load(len(pairs), self.now + copies) - (self.now + copies)
        if so.is_empty:
            state = self.inner.state
            for rid in so.finished_req_ids:
                state.pop(rid, None)
            for rid in so.preempted_req_ids:
                state.pop(rid, None)
            out = ModelRunnerOutput({}, step_time=0.0)
        else:
            out = self.inner.execute(so)
        out.step_time = (out.step_time or 0.0) + copies
        self.copy_stall_s += copies
        if so.kv_loads:
            out.finished_loads = list(so.kv_loads)
        return out
