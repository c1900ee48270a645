"""The host tier's memory and its copies: a host mirror of every device KV tensor, block for block.

SchedulerOutput.kv_stores copy device blocks out before the step's forward may reuse them;
kv_loads copy host slots into device blocks, one job per admission, reported in finished_loads.
On the CPU the copies are synchronous, so every job is done in its own step. On CUDA the host
tensors are pinned and the copies run on their own stream: the forward waits for the stores
(they read blocks it may overwrite), a job is reported once its event has fired, and the
scheduler keeps its request waiting until then.
"""

from __future__ import annotations

import torch

from twinserve.core.errors import InvalidConfigError
from twinserve.core.sched.output import SchedulerOutput

_GIB = 1 << 30


def page_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes one block id spans across the given KV tensors (first dimension: blocks)."""
    return sum(t[0].numel() * t.element_size() for t in tensors)


class HostKVCache:
    """Host tensors mirroring the device KV tensors, with the step's stores and loads."""

    def __init__(self, tensors: list[torch.Tensor], size_gib: float, device: torch.device,
                 size_field: tuple[str, object] | None = None) -> None:
        self.page_bytes = page_bytes(tensors)
        num = int(size_gib * _GIB // self.page_bytes)
        if num < 1:
            # Named as the user gave the size (size_field: the setting and its value), by default in GiB.
            field, value = size_field or ("kv_offloading_size", size_gib)
            raise InvalidConfigError(
                field, value,
                f"at least one KV block: {self.page_bytes} bytes ({self.page_bytes / _GIB:.3g} GiB) per block here")
        self.num_blocks = num
        self.device = device
        self.cuda = device.type == "cuda"
        self.device_tensors = tensors
        # Pinned on CUDA: asynchronous copies need page-locked host memory.
        self.host_tensors = [torch.zeros((num, *t.shape[1:]), dtype=t.dtype, device="cpu", pin_memory=self.cuda)
                             for t in tensors]
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._pending: list[tuple[int, torch.cuda.Event]] = []
        self.blocks_stored = 0
        self.blocks_loaded = 0

    def run(self, so: SchedulerOutput) -> list[int]:
        """The step's stores, then its loads; the jobs now done (earlier steps' too on CUDA)."""
        if self.cuda:
            return self._run_cuda(so)
        if so.kv_stores:
            blocks = torch.tensor([b for b, _ in so.kv_stores], dtype=torch.long)
            slots = torch.tensor([s for _, s in so.kv_stores], dtype=torch.long)
            for dev, host in zip(self.device_tensors, self.host_tensors):
                host.index_copy_(0, slots, dev.index_select(0, blocks))
            self.blocks_stored += len(so.kv_stores)
        done = []
        for job_id, pairs in so.kv_loads.items():
            slots = torch.tensor([s for s, _ in pairs], dtype=torch.long)
            blocks = torch.tensor([b for _, b in pairs], dtype=torch.long)
            for dev, host in zip(self.device_tensors, self.host_tensors):
                dev.index_copy_(0, blocks, host.index_select(0, slots))
            self.blocks_loaded += len(pairs)
            done.append(job_id)
        return done

    def _run_cuda(self, so: SchedulerOutput) -> list[int]:  # pragma: no cover - needs a GPU
        """Copies on the side stream; the compute stream waits only for the stores."""
        stream, compute = self._stream, torch.cuda.current_stream(self.device)
        if so.kv_stores or so.kv_loads:
            stream.wait_stream(compute)  # the previous forward wrote what we copy out
            with torch.cuda.stream(stream):
                for block, slot in so.kv_stores:
                    for dev, host in zip(self.device_tensors, self.host_tensors):
                        host[slot].copy_(dev[block], non_blocking=True)
                self.blocks_stored += len(so.kv_stores)
                if so.kv_stores:
                    compute.wait_stream(stream)  # this step's forward may overwrite those blocks
                for job_id, pairs in so.kv_loads.items():
                    for slot, block in pairs:
                        for dev, host in zip(self.device_tensors, self.host_tensors):
                            dev[block].copy_(host[slot], non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
                    self._pending.append((job_id, event))
                    self.blocks_loaded += len(pairs)
        done = [job for job, event in self._pending if event.query()]
        if done:
            self._pending = [(j, e) for j, e in self._pending if j not in done]
        return done
