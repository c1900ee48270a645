"""Swappable scheduling policies: waiting-queue order and preemption victim."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Iterator, Protocol

from twinserve.core.errors import InvalidConfigError
from twinserve.core.request import Request


class RequestQueue(Protocol):
    """The waiting queue: its order decides admission."""

    def add(self, request: Request) -> None:
        """Enqueue a new request."""

    def prepend(self, request: Request) -> None:
        """Requeue a preempted request."""

    def peek(self) -> Request:
        """The next request to admit."""

    def pop(self) -> Request:
        """Remove the next request."""

    def remove(self, request: Request) -> None:
        """Drop a request (abort)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...


class FCFSQueue:
    """FCFS; preempted requests go back to the front."""

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
    """A heap by rank, ties by arrival; front_on_prepend puts preempted requests first."""

    __slots__ = ("_heap", "_key", "_front", "_front_on_prepend")

    def __init__(self, key: Callable[[Request], tuple], front_on_prepend: bool = False) -> None:
        self._heap: list[tuple[tuple, int, Request]] = []
        self._key = key
        self._front: deque[Request] = deque()
        self._front_on_prepend = front_on_prepend

    def add(self, request: Request) -> None:
        """Insert by rank."""
        heapq.heappush(self._heap, (self._key(request), request.seq_no, request))

    def prepend(self, request: Request) -> None:
        """At the front, or by rank."""
        if self._front_on_prepend:
            self._front.appendleft(request)
        else:
            self.add(request)

    def peek(self) -> Request:
        """A requeued request, else the lowest-ranked."""
        return self._front[0] if self._front else self._heap[0][2]

    def pop(self) -> Request:
        """Remove the next request."""
        return self._front.popleft() if self._front else heapq.heappop(self._heap)[2]

    def remove(self, request: Request) -> None:
        """Remove a request anywhere in the queue."""
        if request in self._front:
            self._front.remove(request)
            return
        self._heap = [e for e in self._heap if e[2] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._front) + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._front) or bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        yield from self._front
        yield from (e[2] for e in sorted(self._heap, key=lambda e: e[:2]))


class PreemptionPolicy(Protocol):
    """Picks the running request that gives its blocks back."""

    def pick_victim(self, running: list[Request]) -> Request:
        """One of running (never empty)."""


class PreemptLastAdmitted:
    """The last admitted loses (FCFS fairness)."""

    def pick_victim(self, running: list[Request]) -> Request:
        """The last request in admission order."""
        return running[-1]


class PreemptLowestPriority:
    """Strict priority, as vLLM: largest value, then latest arrival, loses."""

    def pick_victim(self, running: list[Request]) -> Request:
        """The least important running request, latest arrival on ties."""
        return max(running, key=lambda r: (r.priority, r.arrival_time, r.seq_no))


def _wait_origin(r: Request) -> float:
    """When r's wait began, had it waited unbroken until now."""
    return r.queued_time - r.waited_s


def priority_rank(aging_interval_s: float) -> Callable[[Request], tuple]:
    """Rank by priority; each aging_interval_s waited is one level.

    Leaving out the now term common to all means the heap never re-sorts.
    """
    if aging_interval_s > 0:
        return lambda r: (r.priority + _wait_origin(r) / aging_interval_s, r.arrival_time)
    return lambda r: (r.priority, r.arrival_time)


def sjf_rank(aging_interval_s: float, max_model_len: int) -> Callable[[Request], tuple]:
    """Rank by prompt share of max_model_len; aging_interval_s waited beats any newcomer."""
    if aging_interval_s > 0:
        return lambda r: (r.num_prompt_tokens / max_model_len + _wait_origin(r) / aging_interval_s,)
    return lambda r: (r.num_prompt_tokens,)


# Registries read by the scheduler, simulator, CLIs and docs/policies.md.

def _fcfs(aging_interval_s: float, max_model_len: int) -> RequestQueue:
    return FCFSQueue()


def _priority(aging_interval_s: float, max_model_len: int) -> RequestQueue:
    """Lower priority value first; aged."""
    return KeyedQueue(priority_rank(aging_interval_s))


def _sjf(aging_interval_s: float, max_model_len: int) -> RequestQueue:
    """Shortest prompt first; preempted ones to the front; aged."""
    return KeyedQueue(sjf_rank(aging_interval_s, max_model_len), front_on_prepend=True)


QUEUE_POLICIES: dict[str, Callable[[float, int], RequestQueue]] = {
    "fcfs": _fcfs, "priority": _priority, "sjf": _sjf,
}

PREEMPTION_POLICIES: dict[str, Callable[[], PreemptionPolicy]] = {
    "last": PreemptLastAdmitted,
    "priority": PreemptLowestPriority,
}
# "auto" follows the queue policy (resolve_preemption).
PREEMPTION_CHOICES = ("auto", *PREEMPTION_POLICIES)


def resolve_preemption(name: str, queue_policy: str) -> str:
    """The victim policy a name stands for."""
    if name == "auto":
        return "priority" if queue_policy == "priority" else "last"
    return name


def make_queue(name: str, aging_interval_s: float = 0.0, max_model_len: int = 1) -> RequestQueue:
    """A waiting queue by policy name."""
    factory = QUEUE_POLICIES.get(name)
    if factory is None:
        raise InvalidConfigError("policy", name, " or ".join(QUEUE_POLICIES))
    return factory(aging_interval_s, max_model_len)


def make_preemption_policy(name: str, queue_policy: str) -> PreemptionPolicy:
    """A victim policy by name."""
    factory = PREEMPTION_POLICIES.get(resolve_preemption(name, queue_policy))
    if factory is None:
        raise InvalidConfigError("preemption", name, " or ".join(PREEMPTION_CHOICES))
    return factory()
