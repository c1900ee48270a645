"""Closed-loop clients: N clients, each sending its next request when its last one has finished.

As `vllm bench serve --max-concurrency N --request-rate inf`, aiperf's concurrency mode and
trtllm-bench do: requests are taken in the workload's order, each by the first client to be free;
a client sends think_time_s seconds after its last request's last token (or after a refusal).
The first warmup_requests sent are marked warm-up and left out of the metrics; the measured
window runs from the first measured request's send to the last measured request's finish.
With turns > 1 a client carries one conversation: its follow-up turns, then the next conversation.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterator

from twinserve.sim.workload import WorkItem

INF = float("inf")


def closed_loop_line(cfg: Any) -> str:
    """'closed loop: N clients, think T s, W warm-up requests' for a WorkloadConfig ('' if open loop)."""
    if not cfg.concurrency:
        return ""
    return (f"closed loop: {cfg.concurrency} clients, think {cfg.think_time_s:g} s, "
            f"{cfg.warmup_requests} warm-up requests")


class ClosedLoopSource:
    """The arrivals of N closed-loop clients: a request is released only when its client is free.

    The same interface as sim.world.ArrivalSource (next_time, pop_until, on_done), so the
    single-engine, cluster and disaggregated worlds drive it unchanged.
    """

    def __init__(self, items: Iterator[WorkItem], concurrency: int, think_time_s: float = 0.0,
                 warmup_requests: int = 0) -> None:
        self._items = items
        self.concurrency = concurrency
        self.think_time_s = think_time_s
        self.warmup_requests = warmup_requests
        self.num_sent = 0  # first turns handed to a client (warm-up ones included)
        self._heap: list[tuple[float, int, WorkItem]] = []
        self._seq = 0
        for client in range(concurrency):
            if self._take(client, 0.0) is None:
                break

    def _push(self, item: WorkItem, t: float) -> None:
        item.arrival_time = t
        heapq.heappush(self._heap, (t, self._seq, item))
        self._seq += 1

    def _take(self, client: int, t: float) -> WorkItem | None:
        """Give the client the workload's next first turn, sent at t; None when none is left."""
        item = next(self._items, None)
        if item is None:
            return None
        item.client = client
        item.warmup = self.num_sent < self.warmup_requests
        self.num_sent += 1
        self._push(item, t)
        return item

    def next_time(self) -> float:
        """Send time of the next request (inf when no client has one ready)."""
        return self._heap[0][0] if self._heap else INF

    def pop_until(self, t: float) -> list[WorkItem]:
        """All requests sent at or before t, in send order."""
        out: list[WorkItem] = []
        h = self._heap
        while h and h[0][0] <= t:
            out.append(heapq.heappop(h)[2])
        return out

    def on_done(self, item: WorkItem, t: float, followup: WorkItem | None = None) -> WorkItem | None:
        """The item's client is free at t (its last token, or its refusal): it sends its next
        request (the conversation's follow-up, else the workload's next) think_time_s later."""
        send = t + self.think_time_s
        if followup is not None:
            followup.client = item.client
            followup.warmup = item.warmup
            self._push(followup, send)
            return followup
        return self._take(item.client, send)
