"""The GPU's link to host memory: the host KV tier's loads and stores, priced as DMA copies.

Each direction is its own copy stream (PCIe and NVLink-C2C are full duplex): transfers queue in
order, each taking latency + bytes / bandwidth, and run beside the compute stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.core.errors import InvalidConfigError


@dataclass(slots=True)
class LinkTotals:
    """What crossed the link in one direction over a run."""

    transfers: int = 0
    blocks: int = 0
    bytes: float = 0.0
    busy_s: float = 0.0


class HostLink:
    """Two FIFO copy streams (host to device: loads; device to host: stores) over one link."""

    def __init__(self, bandwidth: float, latency_s: float, block_bytes: float) -> None:
        if not bandwidth > 0.0:
            raise InvalidConfigError("bandwidth", bandwidth, "a host link bandwidth > 0 (bytes/s)")
        if not latency_s >= 0.0:
            raise InvalidConfigError("latency_s", latency_s, "a host link latency >= 0 (seconds)")
        if not block_bytes > 0.0:
            raise InvalidConfigError("block_bytes", block_bytes, "bytes per KV block > 0")
        self.bandwidth = bandwidth
        self.latency_s = latency_s
        self.block_bytes = block_bytes
        # When each stream is next free.
        self.load_free = 0.0
        self.store_free = 0.0
        self.loads = LinkTotals()
        self.stores = LinkTotals()

    def transfer_time(self, num_blocks: int) -> float:
        """Seconds one copy of num_blocks blocks takes on an idle stream."""
        return self.latency_s + num_blocks * self.block_bytes / self.bandwidth

    def load(self, num_blocks: int, now: float) -> float:
        """Queue a host-to-device copy at now; returns when it completes."""
        d = self.transfer_time(num_blocks)
        done = (self.load_free if self.load_free > now else now) + d
        self.load_free = done
        _count(self.loads, num_blocks, num_blocks * self.block_bytes, d)
        return done

    def store(self, num_blocks: int, now: float) -> float:
        """Queue a device-to-host copy at now; returns when it completes."""
        d = self.transfer_time(num_blocks)
        done = (self.store_free if self.store_free > now else now) + d
        self.store_free = done
        _count(self.stores, num_blocks, num_blocks * self.block_bytes, d)
        return done


def _count(t: LinkTotals, blocks: int, nbytes: float, seconds: float) -> None:
    t.transfers += 1
    t.blocks += blocks
    t.bytes += nbytes
    t.busy_s += seconds
