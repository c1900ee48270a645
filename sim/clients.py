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
from typing import Any, Callable, Iterator

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
        self.on_send: Callable[[WorkItem], None] | None = None  # told of every request sent
        for client in range(concurrency):
            if self._take(client, 0.0) is None:
                break

    def queued(self) -> list[WorkItem]:
        """Requests sent but not yet handed to an engine, in send order."""
        return [item for _, _, item in sorted(self._heap, key=lambda e: (e[0], e[1]))]

    def _push(self, item: WorkItem, t: float) -> None:
        item.arrival_time = t
        heapq.heappush(self._heap, (t, self._seq, item))
        self._seq += 1
        if self.on_send is not None:
            self.on_send(item)

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

    def pop_next(self) -> WorkItem:
        """The next request in send order (the caller has checked there is one)."""
        return heapq.heappop(self._heap)[2]

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


class FirstRequestsDone:
    """Says when the first `count` requests in send-time order have all ended for good.

    As a run's abort hook (called with each record) it answers True once `count` requests sent
    before the clock's time have ended and every request sent before them has too. A request
    not sent yet is sent at or after the clock (a closed-loop client sends when its last request
    ends, which is never before now), so none can come before them: the run may stop there and
    those requests' records are exactly a full run's. Requests sent at the same time as the
    last of them must have ended too (a table sorts such ties its own way). A refusal (its client sends at once, at
    the refused request's own time) turns the shortcut off.
    """

    def __init__(self, count: int, clock: Callable[[], float]) -> None:
        self.count = count
        self._clock = clock
        self._sent: list[tuple[float, int, str]] = []
        self._ended: set[str] = set()
        self.num_final = 0  # requests known to be among the first, ended
        self._last = -INF   # send time of the last of them
        self.refused = False

    def watch(self, source: Any) -> None:
        """Hear of every request the closed-loop source sends (those already sent included)."""
        for item in source.queued():
            self.on_send(item)
        source.on_send = self.on_send

    def on_send(self, item: WorkItem) -> None:
        """A request was sent (its arrival_time set)."""
        heapq.heappush(self._sent, (item.arrival_time, len(self._sent), item.request_id))

    def __call__(self, record: Any) -> bool:
        """True once the first `count` requests are final (record: a just-ended request)."""
        if record.finish_reason == "refused":
            self.refused = True
        if self.refused:
            return False
        self._ended.add(record.request_id)
        now = self._clock()
        sent, ended = self._sent, self._ended
        while sent and sent[0][0] < now and sent[0][2] in ended:
            self._last = heapq.heappop(sent)[0]
            self.num_final += 1
        return self.num_final >= self.count and (not sent or sent[0][0] > self._last)
