"""Swappable scheduling policies: waiting-queue order and preemption victim choice."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Iterator, Protocol

from ..errors import InvalidConfigError
from ..request import Request


class RequestQueue(Protocol):
    """The waiting queue: its order decides who is admitted next."""

    def add(self, request: Request) -> None:
        """Enqueue a new request."""

    def prepend(self, request: Request) -> None:
        """Requeue a preempted request ahead of its peers."""

    def peek(self) -> Request:
        """The next request to admit."""

    def pop(self) -> Request:
        """Remove and return the next request to admit."""

    def remove(self, request: Request) -> None:
        """Drop a request (abort)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...


class FCFSQueue:
    """First come, first served; preempted requests go back to the front."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, request: Request) -> None:
        """Enqueue at the back."""
        self._q.append(request)

    def prepend(self, request: Request) -> None:
        """Enqueue at the front."""
        self._q.appendleft(request)

    def peek(self) -> Request:
        """The front request."""
        return self._q[0]

    def pop(self) -> Request:
        """Remove the front request."""
        return self._q.popleft()

    def remove(self, request: Request) -> None:
        """Remove a request anywhere in the queue."""
        self._q.remove(request)

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class KeyedQueue:
    """A heap ordered by a key of the request; ties broken by arrival order."""

    __slots__ = ("_heap", "_key")

    def __init__(self, key: Callable[[Request], tuple]) -> None:
        self._heap: list[tuple[tuple, int, Request]] = []
        self._key = key

    def add(self, request: Request) -> None:
        """Insert by key."""
        heapq.heappush(self._heap, (self._key(request), request.seq_no, request))

    prepend = add  # a preempted request keeps its rank: its key already says where it belongs

    def peek(self) -> Request:
        """The lowest-keyed request."""
        return self._heap[0][2]

    def pop(self) -> Request:
        """Remove the lowest-keyed request."""
        return heapq.heappop(self._heap)[2]

    def remove(self, request: Request) -> None:
        """Remove a request anywhere in the heap."""
        self._heap = [e for e in self._heap if e[2] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[2] for e in sorted(self._heap, key=lambda e: e[:2]))


class PreemptionPolicy(Protocol):
    """Chooses which running request gives its blocks back when memory runs out."""

    def pick_victim(self, running: list[Request]) -> Request:
        """One of the running requests (never called with an empty list)."""


class PreemptLastAdmitted:
    """The most recently admitted request loses its blocks (FCFS fairness)."""

    def pick_victim(self, running: list[Request]) -> Request:
        """The last request in admission order."""
        return running[-1]


class PreemptLowestPriority:
    """The request with the largest priority value, latest arrival on ties."""

    def pick_victim(self, running: list[Request]) -> Request:
        """The least important running request."""
        return max(running, key=lambda r: (r.priority, r.arrival_time, r.seq_no))


QUEUE_POLICIES: dict[str, Callable[[], RequestQueue]] = {
    "fcfs": FCFSQueue,
    "priority": lambda: KeyedQueue(lambda r: (r.priority, r.arrival_time)),
    "sjf": lambda: KeyedQueue(lambda r: (r.num_prompt_tokens,)),
}

PREEMPTION_POLICIES: dict[str, Callable[[], PreemptionPolicy]] = {
    "last": PreemptLastAdmitted,
    "priority": PreemptLowestPriority,
}


def make_queue(name: str) -> RequestQueue:
    """The waiting queue for a policy name: fcfs, priority or sjf."""
    try:
        return QUEUE_POLICIES[name]()
    except KeyError:
        raise InvalidConfigError("policy", name, " or ".join(QUEUE_POLICIES)) from None


def make_preemption_policy(name: str, queue_policy: str) -> PreemptionPolicy:
    """The victim policy for a name; 'auto' follows the queue policy."""
    if name == "auto":
        name = "priority" if queue_policy == "priority" else "last"
    try:
        return PREEMPTION_POLICIES[name]()
    except KeyError:
        raise InvalidConfigError("preemption", name,
                                 " or ".join(["auto", *PREEMPTION_POLICIES])) from None
