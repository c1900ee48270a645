"""Batch policies: whether a step mixes prefill chunks with decodes, or runs prefill first.

- `mixed` (vLLM V1, the default): running requests take the budget first, then waiting ones are
  admitted into the same step; chunks and decodes share every batch.
- `prefill_first` (SGLang's default scheduler, "lock step"): a step that can prefill (a running
  request part-way through its prompt, or a waiting request that can be admitted) prefills only,
  within the token budget; the decodes wait for it. Only a step with nothing to prefill decodes.
  SGLang: `Scheduler.get_next_batch_to_run` (python/sglang/srt/managers/scheduler.py) builds
  `get_new_batch_prefill()` and runs it if it is not None ("Run prefill first if possible"), else
  `update_running_batch` (decode). A chunked request is continued first (`PrefillAdder.add_chunked_req`),
  then waiting requests fill the rest of `chunked_prefill_size` (`rem_chunk_tokens`, schedule_policy.py);
  past the batch's first request, one joins only if its whole input fits in what is left of
  `max_prefill_tokens` (`PrefillAdder.add_one_req`: `real_input_tokens >= self.rem_input_tokens and
  len(self.can_run_list) != 0` -> stop), SchedulerConfig.max_prefill_tokens here.
  Decodes join a prefill batch only with `--enable-mixed-chunk` (off by default: server_args.py
  `enable_mixed_chunk: bool = False`), which is what `mixed` models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from twinserve.core.errors import InvalidConfigError
from twinserve.core.request import Request
from twinserve.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from twinserve.core.sched.step_parts import _block_ids, _chunk, _fast_decode_limit, _lookahead

if TYPE_CHECKING:
    from twinserve.core.sched.scheduler import Scheduler


def is_prefilling(req: Request) -> bool:
    """True while a running request computes prompt tokens (a chunk, or a recompute after preemption)."""
    return len(req.all_token_ids) - req.num_computed_tokens > 1 or not req.output_token_ids


class BatchPolicy(Protocol):
    """Builds each step's batch from the scheduler's running and waiting requests."""

    name: str

    def schedule(self, sched: Scheduler, now: float) -> SchedulerOutput:
        """This step's batch."""


class MixedBatches:
    """vLLM V1: one budget, running requests first, then admissions, prefill and decode together."""

    name = "mixed"

    def schedule(self, sched: Scheduler, now: float) -> SchedulerOutput:
        """A mixed step."""
        return sched.schedule_batch(now)


class PrefillFirst:
    """SGLang: a step prefills only when anything can prefill; otherwise it decodes every running request."""

    name = "prefill_first"

    def schedule(self, sched: Scheduler, now: float) -> SchedulerOutput:
        """A prefill-only step if one can run, else a decode-only step."""
        so, stuck = self._prefill_step(sched, now)
        if so is not None:
            return so
        if stuck:
            # A prompt with no room for its next chunk waits while the decodes run (they may preempt).
            decoding = [r for r in sched.running if not is_prefilling(r)]
            if decoding:
                return sched.schedule_batch(now, decoding, admit=False)
            # Nothing but prompts: the mixed step's preemption frees room for them.
        return sched.schedule_batch(now, admit=False)

    @staticmethod
    def _prefill_step(sched: Scheduler, now: float) -> tuple[SchedulerOutput | None, bool]:
        """Continue running prompts, then admit waiting requests, in one budget; None if nothing prefills.

        Also says whether a running prompt found no KV room for its next chunk (then nothing is admitted).
        """
        cfg = sched.config
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        max_model_len = cfg.max_model_len
        kv = sched.kv
        allocate = kv.allocate_slots
        spec = sched.spec
        lookahead = sched.lookahead if spec is not None and spec.active(len(sched.running)) else 0
        c_ids: list[str] = []
        c_blocks: list = []
        c_computed: list[int] = []
        num_scheduled: dict[str, int] = {}
        stuck = False
        for req in sched.running:
            if budget <= 0:
                break
            c = req.num_computed_tokens
            num_new = len(req.all_token_ids) - c
            if num_new <= 0 or c < 0:  # a wrong computed-token count: skipped forever, or positions < 0
                sched._stalled.append(req)
                continue
            if num_new == 1 and req.output_token_ids:
                continue  # decoding (is_prefilling, inlined)
            rest = num_new
            num_new = _chunk(num_new, threshold, budget)
            if num_new < rest:
                sched._partial.append(req)
            la = _lookahead(req, c + num_new, lookahead, max_model_len) if lookahead else 0
            new_blocks = allocate(req, num_new + la, num_draft_tokens=la) if la else None
            if new_blocks is None:
                new_blocks = allocate(req, num_new)
            if new_blocks is None:
                stuck = True  # SGLang's prefill never preempts: it waits for room
                break
            rid = req.request_id
            req.fast_decode_limit = _fast_decode_limit(kv, rid)
            c_ids.append(rid)
            c_blocks.append(_block_ids(new_blocks))
            c_computed.append(c)
            num_scheduled[rid] = num_new
            req.num_computed_tokens = c + num_new
            budget -= num_new
        new_reqs: list[NewRequestData] = []
        if not stuck:  # a prompt waiting for room keeps it: newcomers would take it
            budget = sched._admit(now, budget, num_scheduled, new_reqs, lookahead, cfg.max_prefill_tokens)
        if not num_scheduled:
            return None, stuck
        so = sched.emit_step(new_reqs, CachedRequestData(c_ids, c_blocks, c_computed), num_scheduled,
                             cfg.max_num_batched_tokens - budget, [], {})
        return so, stuck


BATCH_POLICIES: dict[str, type] = {"mixed": MixedBatches, "prefill_first": PrefillFirst}


def make_batch_policy(name: str) -> BatchPolicy:
    """The batch policy registered as `name`."""
    try:
        return BATCH_POLICIES[name]()
    except KeyError:
        raise InvalidConfigError("batch_policy", name, ", ".join(repr(n) for n in BATCH_POLICIES)) from None
