"""A request's state as the scheduler sees it, and its lifecycle."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Iterator

from twinserve.core.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Lifecycle state; values past PREEMPTED are terminal."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def is_finished(self) -> bool:
        """True for the terminal states."""
        return self >= RequestStatus.FINISHED_STOPPED


class FinishReason(str, enum.Enum):
    """Why a request ended, in OpenAI API words."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


FINISH_STATUS: dict[FinishReason, RequestStatus] = {
    FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH,
    FinishReason.ABORT: RequestStatus.FINISHED_ABORTED,
    FinishReason.ERROR: RequestStatus.FINISHED_ERROR,
}


class PromptView(Sequence):
    """The first n items of a list that only grows past them, read in place: the prompt of a
    Request that owns its prompt list as all_token_ids (Request.owning). Reads as the prompt list
    would (len, index, slice, iteration, == a list); it cannot be changed."""

    __slots__ = ("_tokens", "_n")

    def __init__(self, tokens: list[int], n: int) -> None:
        self._tokens = tokens
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self._tokens[:self._n][i]
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("prompt index out of range")
        return self._tokens[i]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._tokens, self._n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, PromptView)):
            return len(other) == self._n and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"PromptView({self._tokens[:self._n]!r})"


@dataclass(slots=True, eq=False)
class Request:
    """One generation request: tokens, progress and timestamps."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    cache_salt: str | None = None
    eos_token_id: int | None = None
    # Caller data (e.g. the simulator's workload record).
    payload: Any = None

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    max_tokens: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    # Prefix-cache keys of full blocks, filled lazily.
    block_hashes: list[Any] = field(default_factory=list)
    # Prefix-cache hits on first admission.
    prefix_hit_tokens: int = -1
    num_preemptions: int = 0
    # Arrival order: breaks ties in queues.
    seq_no: int = 0

    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    preempted_times: list[float] = field(default_factory=list)
    # Quick stop check set by Scheduler.add_request; only a hit runs the full rule.
    stop_check_ids: frozenset[int] = field(default=frozenset(), repr=False)
    stop_check_len: int = field(default=0, repr=False)
    # Below this, a one-token step needs nothing from the KV manager
    # (never too high: blocks only grow); 0 means ask.
    fast_decode_limit: int = field(default=0, repr=False)
    # Blocks it holds at its peak under peak_owner's layout (guaranteed_no_evict's reservation); -1: not yet.
    peak_blocks: int = field(default=-1, repr=False)
    peak_owner: int = field(default=-1, repr=False, compare=False)
    # Aging counts waiting only: this wait's start, and time waited before it.
    queued_time: float = field(default=0.0, repr=False)
    waited_s: float = field(default=0.0, repr=False)
    # Unverified drafts for the next step (never in all_token_ids).
    spec_token_ids: list[int] = field(default_factory=list, repr=False)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.all_token_ids = list(self.prompt_token_ids)

    @classmethod
    def owning(cls, request_id: str, token_ids: list[int], *args: Any, **kwargs: Any) -> "Request":
        """A Request that takes the caller's list over as its all_token_ids (no copy): the caller
        made it for this request and neither reads past its prompt nor changes it after (the
        simulator's prompts; a finished prefill request's tokens handed to its decode side).
        prompt_token_ids is a PromptView of its first len(token_ids) items. Saves the ~11 us copy
        of a 4,000-token prompt per request and per disaggregated half (issue 50)."""
        req = cls(request_id, (), *args, **kwargs)
        req.prompt_token_ids = PromptView(token_ids, len(token_ids))  # type: ignore[assignment]
        req.all_token_ids = token_ids
        return req

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens so far."""
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        """True once the request has ended for any reason."""
        return self.status >= RequestStatus.FINISHED_STOPPED

    def append_output_token(self, token_id: int, now: float) -> None:
        """Record one sampled token and its time."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
