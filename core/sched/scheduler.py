"""Iteration-level scheduler in the shape of vLLM v1: one token budget, no phases.

Running requests get tokens first, then waiting ones are admitted; chunked prefill, mixed
batches and prefix-cache skips all fall out of num_computed_tokens. The batch policy
(core/sched/batch_policy.py) may instead keep prefill and decode in separate steps (SGLang).
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Sequence

from twinserve.core.errors import InvalidRequestError, PromptTooLongError
from twinserve.core.kv.groups import max_pages
from twinserve.core.kv.host_tier import HostTier
from twinserve.core.kv.kv_cache_manager import KVCacheManager
from twinserve.core.kv.tier_tables import GroupTierHits, TierHits
from twinserve.core.request import FINISH_STATUS, FinishReason, Request, RequestStatus
from twinserve.core.sched.config import SchedulerConfig
from twinserve.core.sched.fast_loop import no_block_ids, plain_head
from twinserve.core.sched.output import (CachedRequestData, EngineCoreOutput, NewRequestData,
                     SchedulerOutput)
from twinserve.core.sched.batch_policy import make_batch_policy
from twinserve.core.sched.policies import make_preemption_policy, make_queue
from twinserve.core.sched.update import OutputUpdate
from twinserve.core.sched.step_parts import (_NO_BLOCKS, _NO_IDS, _block_ids, _chunk, _draft_len,
                                             _fast_decode_limit, _lookahead, _refresh_fast_decode_limit)
from twinserve.core.spec_decode import SpecDecodeStats, SpeculativeConfig


# One key per scheduler ever made (Request.peak_owner holds it: an int, so no request keeps a scheduler alive).
_SCHEDULER_KEYS = itertools.count()

class Scheduler(OutputUpdate):
    """Decides who runs each step with how many tokens; applies the results."""

    def __init__(self, config: SchedulerConfig,
                 speculative_config: SpeculativeConfig | None = None) -> None:
        self.config = config
        self.peak_key = next(_SCHEDULER_KEYS)  # names this scheduler on the requests' peak_blocks
        # guaranteed_no_evict: an upper bound on the running requests' owed blocks carried between steps
        # (-1: none). Owed blocks shrink as requests grow or end, and grow only by admissions and by the
        # blocks sliding windows free (KVCacheManager.num_window_freed, owed_freed when the bound was made).
        self.owed_bound = -1
        self.owed_freed = 0
        # While set: the blocks the first count running requests owe (_running_blocks_owed's sum), from a
        # caller that holds them as counts (sim/spec_lazy.py, during a drafting join step's admissions), or
        # None where it cannot tell (the sum is made here).
        self.owed_counts: Callable[[int], int | None] | None = None
        self.spec = speculative_config
        self.spec_stats = SpecDecodeStats()
        self.lookahead = speculative_config.num_lookahead_tokens if speculative_config is not None else 0
        self.step_num_spec_reqs = 0
        self.step_num_draft_tokens = 0
        self.step_num_accepted_tokens = 0
        # Trimmed blocks not yet announced to the executor.
        self._dropped: dict[str, int] = {}
        self.kv = KVCacheManager(config.num_blocks, config.block_size,
                                 config.enable_prefix_caching, config.prefix_caching_hash_algo,
                                 sliding_window=config.sliding_window or None,
                                 kv_groups=tuple(config.kv_groups),
                                 max_step_tokens=config.max_num_batched_tokens,
                                 host_tier=(HostTier(config.kv_offloading_blocks, config.kv_offloading_policy)
                                            if config.kv_offloading_blocks else None))
        # Requests admitted with host-tier hits, waiting for their load job (as vLLM's waiting for remote KV).
        self.loading: dict[str, Request] = {}
        # Loaded, holding their blocks: admitted before the queue, so a hold never blocks its head.
        self.loaded: list[Request] = []
        self.waiting = make_queue(config.policy, config.aging_interval_s, config.max_model_len)
        self.preemption_policy = make_preemption_policy(config.preemption, config.policy)
        self.batch_policy = make_batch_policy(config.batch_policy, config.batch_wait_iters,
                                              config.batch_wait_tokens_ratio, config.adp_ranks,
                                              config.adp_balance_iters, config.adp_batching_wait_iters)
        self.running: list[Request] = []
        self._adp_rank: dict[str, int] = {}  # request id -> its attention-DP rank (SchedulerConfig.adp_per_rank)
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self.watermark_blocks = int(config.watermark * config.num_blocks)
        # The step not yet applied by update_from_output.
        self._in_flight: dict[str, int] | None = None
        # Set when a step took every running request: update_from_output walks running.
        self._whole_batch: SchedulerOutput | None = None
        self._whole_batch_len = 0
        # Last first-loop ids and their {id: 1} dict, copied when they repeat.
        self._last_ids: list[str] = []
        self._last_ones: dict[str, int] = {}
        self._seq = itertools.count()
        # Running requests found with no token left to compute (a wrong count): failed after the step is built.
        self._stalled: list[Request] = []
        # Requests scheduled a chunk short of their last token (they sample nothing): this step's, the last step's.
        self._partial: list[Request] = []
        self._step_partial: list[Request] = []
        # Error outputs of requests failed while scheduling; update_from_output returns them.
        self.failed_outputs: list[EngineCoreOutput] = []
        # recv_interval > 1 (SGLang's receive poll, _received): requests added since the last poll,
        # the poll counter, and whether the last step prefilled.
        self.unreceived: list[Request] = []
        self.recv_counter = 0
        self._last_step_prefill = False
        # overlap_scheduler (TensorRT-LLM's overlap loop, _fetched_late): requests added since the last step began.
        self.unfetched: list[Request] = []
        # How a step's new blocks reach the executor: their ids (block_ids), or none (no_block_ids:
        # executor_reads_tables False).
        self._table_ids = _block_ids

    @property
    def executor_reads_tables(self) -> bool:
        """Whether the executor reads block ids and new requests' token lists (the real engine's
        does; the default). Set False for an executor that reads only counts (the simulator's cost
        model, sim/build.py): every block id list it is given is then the shared empty NO_IDS, and a
        new request's token_ids is the request's own list, not a copy (its length, which is what is
        read, is the copy's until update_from_output appends the step's token, after execute)."""
        return self._table_ids is _block_ids

    @executor_reads_tables.setter
    def executor_reads_tables(self, reads: bool) -> None:
        self._table_ids = _block_ids if reads else no_block_ids

    # ------------------------------------------------------------------ requests
    def add_request(self, request: Request) -> None:
        """Queue a request; a typed error if it can never be served."""
        cfg = self.config
        rid = request.request_id
        if rid in self.requests:
            raise InvalidRequestError(f"request id {rid!r} is already in use", param="request_id")
        if request.num_computed_tokens:
            raise InvalidRequestError(
                f"request {rid!r} arrives with num_computed_tokens={request.num_computed_tokens}: a new request "
                "starts at 0 (prefix-cache hits and KV loads are counted by the scheduler)",
                param="num_computed_tokens")
        n = request.num_prompt_tokens
        if n == 0:
            raise InvalidRequestError("the prompt is empty: give at least one token", param="prompt")
        if n > cfg.prompt_limit:
            bound = "max_prompt_len" if cfg.prompt_limit < cfg.max_model_len else "max_model_len"
            raise PromptTooLongError(
                f"prompt has {n} tokens but {bound} is {cfg.prompt_limit}; "
                f"shorten the prompt or raise {bound}", n, cfg.prompt_limit)
        sp = request.sampling_params
        max_tokens = sp.max_tokens if sp.max_tokens is not None else cfg.max_model_len - n
        request.max_tokens = max(1, max_tokens)
        # Peak KV tokens: the last token is never fed back.
        peak = max(n, min(n + request.max_tokens - 1, cfg.max_model_len - 1))
        if not self.kv.can_fit(peak):
            limit = cfg.num_blocks * cfg.block_size
            raise PromptTooLongError(
                f"request needs up to {peak} tokens of KV cache but the whole pool holds {limit} "
                f"({cfg.num_blocks} blocks of {cfg.block_size}); lower max_tokens or add blocks",
                peak, limit)
        stop_ids = set(sp.stop_token_ids)
        if request.eos_token_id is not None and not sp.ignore_eos:
            stop_ids.add(request.eos_token_id)
        request.stop_check_ids = frozenset(stop_ids)
        request.stop_check_len = min(n + request.max_tokens, cfg.max_model_len)
        request.seq_no = next(self._seq)
        request.queued_time = request.arrival_time
        request.waited_s = 0.0
        request.status = RequestStatus.WAITING
        self.requests[rid] = request
        self.waiting.add(request)
        if cfg.recv_interval > 1:
            self.unreceived.append(request)
        if cfg.overlap_scheduler:
            self.unfetched.append(request)

    def abort_requests(self, request_ids: Iterable[str],
                       reason: FinishReason = FinishReason.ABORT, now: float | None = None
                       ) -> list[EngineCoreOutput]:
        """End requests wherever they are; unknown ids are ignored."""
        outputs = []
        status = FINISH_STATUS[reason]
        for rid in request_ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            computed = None
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
                in_flight = self._in_flight
                if in_flight is not None and rid in in_flight:
                    # Its in-flight step may never compute its blocks: uncache them.
                    computed = req.num_computed_tokens - in_flight[rid]
            elif rid in self.loading:
                del self.loading[rid]  # its job still finishes, for the blocks' sake
            elif req in self.loaded:
                self.loaded.remove(req)
            else:
                self.waiting.remove(req)
            self._dropped.pop(rid, None)
            self.kv.free(req, computed)
            req.status = status
            req.finish_reason = reason
            req.finish_time = now
            self.finished_req_ids.add(rid)
            outputs.append(EngineCoreOutput(rid, [], reason))
        return outputs

    @property
    def num_running(self) -> int:
        """Requests holding KV blocks."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued, preempted ones and those waiting for host-tier loads included."""
        return len(self.waiting) + len(self.loading) + len(self.loaded)

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running, or a host-tier load is in flight."""
        return bool(self.running) or len(self.waiting) > 0 or bool(self.kv.load_jobs) or bool(self.loaded)

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (refused while requests hold blocks)."""
        self.kv.reset_prefix_cache()

    # ------------------------------------------------------------------ schedule
    def schedule(self, now: float) -> SchedulerOutput:
        """Pick this step's batch; the batch policy decides whether prefill and decode share it."""
        if not self.config.overlap_scheduler and self.config.recv_interval <= 1:
            so = self.batch_policy.schedule(self, now)
        else:
            hidden = self.hide_unread()
            so = self.batch_policy.schedule(self, now)
            self.note_step(so)
            self.show_unread(hidden)
        if self._stalled:
            self._fail_stalled(now)
        return so

    def hide_unread(self) -> tuple[list[Request] | None, list[Request] | None]:
        """Begin a step that may admit: the requests it cannot read yet, out of the waiting queue until
        show_unread (TensorRT-LLM's overlap loop, hide_late; SGLang's receive poll, _received, which this
        call advances once). Every path that admits calls it once a step (schedule, the cluster's join
        steps), then note_step with the step built."""
        late = self.hide_late() if self.config.overlap_scheduler else None
        unread = None
        if self.config.recv_interval > 1:
            unread = self._received()
            if late and unread:
                held = {id(r) for r in late}
                unread = [r for r in unread if id(r) not in held]  # out of the queue already
            for req in unread:  # not read yet: out of the queue for this step
                self.waiting.remove(req)
        return late, unread

    def show_unread(self, hidden: tuple[list[Request] | None, list[Request] | None]) -> None:
        """Put hide_unread's requests back at the queue's tail (the newest requests), in schedule()'s order."""
        late, unread = hidden
        if unread:
            for req in unread:
                self.waiting.add(req)
        if late:
            self.unhide(late)

    def note_step(self, so: SchedulerOutput, decodes: int = 0) -> None:
        """The receive poll's weight of the step just built: a step with any prompt tokens is an extend
        batch (SGLang's weight 1000, _received). decodes: plain decodes counted in so's total but not in
        its per-request counts (the cluster's join steps apply them as a one-step window)."""
        if self.config.recv_interval > 1:
            self._last_step_prefill = bool(so.scheduled_new_reqs) or (
                so.total_num_scheduled_tokens - decodes > len(so.num_scheduled_tokens)
                + sum(len(d) for d in so.scheduled_spec_decode_tokens.values()))

    def poll_state(self) -> tuple | None:
        """The read-gating state hide_unread changes (to undo a step that is not taken: poll_restore);
        None when no read is gated (hide_unread changes nothing: no copies on the join steps' path)."""
        if self.config.recv_interval <= 1 and not self.config.overlap_scheduler:
            return None
        return self.recv_counter, self._last_step_prefill, list(self.unreceived), list(self.unfetched)

    def poll_restore(self, state: tuple) -> None:
        """Put back what poll_state saved: the step it was saved for is left to schedule()."""
        self.recv_counter, self._last_step_prefill, unreceived, unfetched = state
        self.unreceived = unreceived
        self.unfetched = unfetched

    def advance_recv(self, k: int) -> None:
        """k decode steps applied without schedule() (fast_forward, lazy decodes): the receive poll's
        counter as k schedule() calls would leave it (each adds the step before's weight and reads at N,
        zeroing it; nothing waits during such a run, so nothing is read)."""
        self.batch_policy.advance(k, len(self.running))  # a step-counting policy's count (AdpBalance)
        if k > 0 and self.unfetched:
            self.unfetched = []  # read by the window's first step (_fetched_late)
        n = self.config.recv_interval
        if n <= 1 or k <= 0:
            return
        c = self.recv_counter + (1000 if self._last_step_prefill else 1)
        if c >= n:
            c = 0
        self.recv_counter = (c + k - 1) % n
        self._last_step_prefill = False

    def hide_late(self) -> list[Request]:
        """Begin a step under the overlap scheduler: the requests it cannot read yet (_fetched_late), out of the
        waiting queue until unhide. Every step that may admit calls it once (schedule, the cluster's join steps)."""
        late = self._fetched_late()
        for req in late:
            self.waiting.remove(req)
        return late

    def unhide(self, late: list[Request]) -> None:
        """Put hide_late's requests back at the queue's tail, in their order (the newest requests)."""
        for req in late:
            self.waiting.add(req)

    def _fetched_late(self) -> list[Request]:
        """TensorRT-LLM's overlap scheduler (SchedulerConfig.overlap_scheduler): the requests this step cannot read.

        The PyTorch executor's `_executor_loop_overlap` (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/
        py_executor.py @9521caf4, and the same order in the library's later stored copies) runs, each iteration:
        fetch new requests (`_fetch_new_requests`), schedule, launch the forward step, sample asynchronously, and
        only then `_process_previous_batch` (which waits on the previous step's sampler event, then sends its
        responses). So iteration n+1 fetches as soon as step n is launched, while step n runs on the GPU behind
        step n-1: a request that arrives after step n began is not in step n+1 but in step n+2. The fetch blocks
        only with no active request (`timeout = None if total_num_active_requests == 0`): an engine with nothing
        running reads at once. Here: the requests added since the last step began (added at that step's end,
        i.e. they arrived while it ran), held out of this step while any request runs; they are read next step.
        A first token still leaves at its step's end (its response goes out once the host has launched the next
        step, which the GPU step covers). Decode windows without schedule() clear the list (advance_recv).
        """
        late = self.unfetched
        if not late:
            return []
        self.unfetched = []
        if not self.running:
            return []
        return [r for r in late if r.status == RequestStatus.WAITING and r.request_id in self.requests]

    def _received(self) -> list[Request]:
        """SGLang's receive poll (--scheduler-recv-interval N): the requests still unread this step.

        SGLang (python/sglang/srt/managers/scheduler_recv_skipper.py, `SchedulerRecvSkipper.handle`, called
        by `Scheduler.recv_requests` at the top of each loop iteration) adds the last batch's weight to a
        counter: 1 for a decode (or verify) batch or no batch, 1000 (SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_
        DEFAULT) for any other (an extend, i.e. a prefill), and reads the socket only when the counter
        reaches N, then zeroes it. So after a prefill step new requests are read at once; during decodes,
        every N steps. An idle engine spins its loop (no forward pass, weight 1 a turn, microseconds):
        read at once here. Decode steps applied without schedule() (fast_forward) count through
        advance_recv.
        """
        self.recv_counter += 1000 if self._last_step_prefill else 1
        self._last_step_prefill = False
        if self.recv_counter >= self.config.recv_interval or not self.running:
            self.recv_counter = 0
            self.unreceived.clear()
            return []
        # Finished or aborted requests leave the list (an abort may come before the read).
        unread = [r for r in self.unreceived if r.status == RequestStatus.WAITING and r.request_id in self.requests]
        self.unreceived = unread
        return unread

    def schedule_batch(self, now: float, running: list[Request] | None = None,
                       admit: bool = True) -> SchedulerOutput:
        """A mixed step: `running` (default all running requests, in order) first, then admissions."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        kv = self.kv
        allocate = kv.allocate_slots
        if running is None:
            running = self.running
        c_ids: list[str] = []
        c_computed: list[int] = []
        preempted: list[str] = []
        add_id, add_computed = c_ids.append, c_computed.append
        # Fast loop (no preemption): decodes under fast_decode_limit skip allocate_slots;
        # `head` fits one token each, `spare` is the rest; the checked loop below follows.
        other: dict[int, tuple[int, Sequence[int]]] = {}
        head = running if len(running) <= budget else running[:budget]
        spare = budget - len(head)
        extra = 0  # tokens past one per request
        skipped = 0  # requests with nothing to compute
        spec = self.spec
        spec_on = spec is not None and spec.active(len(running))
        spec_tokens: dict[str, list[int]] = {}
        lookahead = self.lookahead if spec_on else 0
        max_model_len = cfg.max_model_len
        # Without speculation, the loop as it was before drafts (the plain decode hot path).
        if not spec_on:
            extra, skipped = plain_head(head, kv, c_ids, c_computed, other, spare, threshold, budget,
                                        self._stalled, self._partial, self._table_ids)
            head = ()
        for req in head:
            c = req.num_computed_tokens
            num_new = len(req.all_token_ids) - c
            rid = req.request_id
            if num_new == 1:
                # Drafts take only spare budget (checked only when speculation is on).
                k = _draft_len(req, spare) if spec_on and req.spec_token_ids else 0
                if k > 0:
                    spec_tokens[rid] = req.spec_token_ids[:k]
                    num_new += k
                # Past the bound: fast-forward advanced it, so refresh.
                elif not lookahead and (c < req.fast_decode_limit or (
                        c > req.fast_decode_limit and c < _refresh_fast_decode_limit(kv, req))):
                    add_id(rid)
                    add_computed(c)
                    req.num_computed_tokens = c + 1
                    continue
            else:
                k = 0
                if num_new <= 0 or c < 0:  # a wrong computed-token count: skipped forever, or positions < 0
                    self._stalled.append(req)
                    skipped += 1
                    spare += 1
                    continue
                rest = num_new
                num_new = _chunk(num_new, threshold, budget - len(c_ids) - extra)
                if num_new <= 0:
                    skipped += 1
                    spare += 1
                    continue
                if num_new < rest:
                    self._partial.append(req)
            la = _lookahead(req, c + num_new - k, lookahead, max_model_len) if lookahead else 0
            if k or la:
                new_blocks = allocate(req, num_new + la, num_draft_tokens=k + la)
                if new_blocks is None and la:  # lookahead only where it fits: fewer drafts
                    new_blocks = allocate(req, num_new, num_draft_tokens=k)
            else:
                new_blocks = allocate(req, num_new)
            if new_blocks is None:
                spec_tokens.pop(rid, None)
                break  # needs preemption: the loop below
            req.fast_decode_limit = _fast_decode_limit(kv, rid)
            other[len(c_ids)] = (num_new, self._table_ids(new_blocks))
            add_id(rid)
            add_computed(c)
            req.num_computed_tokens = c + num_new
            extra += num_new - 1
            spare -= num_new - 1
            if spare < 0:
                break  # the loop below checks the rest
        i = len(c_ids) + skipped
        budget -= len(c_ids) + extra
        if c_ids == self._last_ids:
            # Steady decode: a dict copy is far cheaper than a rebuild.
            num_scheduled = self._last_ones.copy()
        else:
            num_scheduled = dict.fromkeys(c_ids, 1)
            self._last_ids = c_ids[:]  # c_ids goes to the executor
            self._last_ones = num_scheduled.copy()
        c_blocks: list[Sequence[int]] = [_NO_IDS] * len(c_ids)
        for k, (n, block_ids) in other.items():
            num_scheduled[c_ids[k]] = n
            c_blocks[k] = block_ids
        add_blocks = c_blocks.append

        while i < len(running) and budget > 0:
            req = running[i]
            num_new = len(req.all_token_ids) - req.num_computed_tokens
            if num_new <= 0 or req.num_computed_tokens < 0:  # a wrong computed-token count (as above)
                self._stalled.append(req)
                i += 1
                continue
            rest = num_new
            num_new = _chunk(num_new, threshold, budget)
            if num_new <= 0:
                i += 1
                continue
            if num_new < rest:
                self._partial.append(req)
            k = _draft_len(req, budget - 1) if num_new == 1 and spec_on and req.spec_token_ids else 0
            if k > 0:
                num_new += k
            la = (_lookahead(req, req.num_computed_tokens + num_new - k, lookahead, max_model_len)
                  if lookahead else 0)
            while True:
                new_blocks = allocate(req, num_new + la, num_draft_tokens=k + la) if la else None
                if new_blocks is None:
                    new_blocks = allocate(req, num_new, num_draft_tokens=k)
                if new_blocks is not None:
                    break
                victim = self.preemption_policy.pick_victim(running)
                j = running.index(victim)
                del running[j]
                computed = None
                if j < i:
                    i -= 1
                    vid = victim.request_id
                    # If scheduled, hand its tokens back.
                    n = num_scheduled.pop(vid, 0)
                    if n:
                        budget += n
                        # Its registered blocks will never be computed.
                        computed = victim.num_computed_tokens - n
                        spec_tokens.pop(vid, None)
                        j = c_ids.index(vid)
                        del c_ids[j], c_blocks[j], c_computed[j]
                self._preempt(victim, now, computed)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if new_blocks is None:
                continue  # req itself was preempted
            rid = req.request_id
            if k > 0:
                spec_tokens[rid] = req.spec_token_ids[:k]
            req.fast_decode_limit = _fast_decode_limit(kv, rid)
            add_id(rid)
            add_blocks(self._table_ids(new_blocks))
            add_computed(req.num_computed_tokens)
            num_scheduled[rid] = num_new
            req.num_computed_tokens += num_new
            budget -= num_new
            i += 1

        new_reqs: list[NewRequestData] = []
        if preempted:
            if running is not self.running:  # a sub-list lost its victims: so does running
                self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        elif admit:
            budget = self._admit(now, budget, num_scheduled, new_reqs, lookahead)
        return self.emit_step(new_reqs, CachedRequestData(c_ids, c_blocks, c_computed), num_scheduled,
                              cfg.max_num_batched_tokens - budget, preempted, spec_tokens)

    def emit_step(self, new_reqs: list[NewRequestData], cached: CachedRequestData,
                  num_scheduled: dict[str, int], total: int, preempted: list[str],
                  spec_tokens: dict[str, list[int]]) -> SchedulerOutput:
        """The step's SchedulerOutput, with what happened since the last one (finished, trimmed, transfers)."""
        self._in_flight = num_scheduled
        self._step_partial, self._partial = self._partial, []
        finished = self.finished_req_ids
        self.finished_req_ids = set()
        dropped = self._dropped
        self._dropped = {}
        so = SchedulerOutput(new_reqs, cached, num_scheduled, total, preempted, finished, spec_tokens, dropped)
        kv = self.kv
        if kv.host is not None:
            so.kv_stores, so.kv_loads = kv.take_transfers()
        # Same order as running, so equal counts mean all were taken.
        running = self.running
        whole = len(num_scheduled) == len(running)
        self._whole_batch = so if whole else None
        self._whole_batch_len = len(running)
        return so

    def _admit(self, now: float, budget: int, num_scheduled: dict[str, int],
               new_reqs: list[NewRequestData], lookahead: int = 0, prefill_cap: int = 0) -> int:
        """Admit waiting requests while budget, seats and blocks allow; the budget left.

        prefill_cap > 0: past the step's first request, one joins only if its whole prompt fits in
        prefill_cap less the step's tokens (SGLang's max_prefill_tokens; batch_policy.py).
        """
        cfg = self.config
        kv = self.kv
        waiting = self.waiting
        running = self.running
        threshold = cfg.long_prefill_token_threshold
        loaded = self.loaded
        no_evict = cfg.capacity_policy == "guaranteed_no_evict"
        owed = -1  # blocks running requests still need to reach max_tokens (guaranteed_no_evict; summed once)
        # Without drafts or a host tier, a running request's held blocks shrink only where a sliding window
        # frees them, so the last step's owed count, plus its admissions' owed blocks, plus the blocks
        # windows freed since, bounds this step's from above: an admission that fits under the bound fits
        # under the exact count with the same blocks, so the sum over every running request is made only
        # when the bound leaves it in doubt, and then over the requests running before this call, plus
        # what this call's admissions added (as the exact count at every step has it).
        bounded = no_evict and kv.host is None and self.spec is None and not lookahead
        exact = True
        num_before = len(running)
        step_own = 0  # owed blocks this call's admissions added (each its peak less its pages)
        # With windows an admission may hold fewer blocks than its pages: its owed blocks after it (peak
        # less held) exceed `own`, by this much summed, which the carried bound adds.
        held_short = 0
        tables = self.executor_reads_tables
        ranks = cfg.adp_ranks if cfg.adp_per_rank else 1
        if ranks > 1:  # each attention-DP rank's own seats and step tokens (SchedulerConfig.adp_per_rank)
            rank_seqs, rank_room, rank_tokens = self._rank_loads(ranks, num_scheduled)
            rank_seats = cfg.max_num_seqs // ranks
        while (waiting or loaded) and budget > 0 and len(running) < cfg.max_num_seqs:
            # Back from a host-tier load: it holds its hits' blocks (and the first chunk's).
            req = loaded[0] if loaded else waiting.peek()
            done = req.num_computed_tokens
            if done:
                hits, num_hit = _NO_BLOCKS, 0
            else:
                hits, num_hit = kv.get_computed_blocks(req)
            num_new = req.num_tokens - done - num_hit
            if num_new <= 0 or num_hit < 0 or (done and (done < 0 or not loaded)):
                # A hit or a load counted past the last token (or a queued request's count was set):
                # it would run with nothing to sample, or from KV nobody computed.
                self._fail(req, done + num_hit, ("a host-tier (KV) load counted it, leaving no token to compute"
                                                 if loaded else "it was set while the request was queued; "
                                                 "only the scheduler sets it") if done else
                           "a prefix-cache hit counted it, leaving no token to compute", now)
                continue
            if prefill_cap and num_scheduled and num_new >= prefill_cap - (cfg.max_num_batched_tokens - budget):
                break
            if cfg.enable_chunked_prefill:
                if 0 < threshold < num_new:
                    num_new = threshold
                if num_new > budget:
                    num_new = budget
            elif num_new > budget:
                break
            if ranks > 1:
                # The rank TensorRT-LLM's balance gives it: below its seats, fewest active prompt tokens, then
                # requests, then the lowest; it runs within that rank's tokens or waits (FCFS: the queue too).
                rank = min((k for k in range(ranks) if rank_seqs[k] < rank_seats),
                           key=lambda k: (rank_tokens[k], rank_seqs[k], k), default=-1)
                if rank < 0 or rank_room[rank] <= 0:
                    break
                if num_new > rank_room[rank]:
                    if not cfg.enable_chunked_prefill:
                        break
                    num_new = rank_room[rank]
            # Headroom for running requests; with none it would only block.
            reserve = self.watermark_blocks if running else 0
            if no_evict:
                # What running requests still need to reach max_tokens, and this one past this chunk.
                pages = max_pages(done + num_hit + num_new, kv.block_size, kv.group_windows, kv.max_step_tokens)
                own = self._peak_blocks(req) - pages
                if owed < 0:
                    if bounded and self.owed_bound >= 0:
                        owed, exact = self.owed_bound + kv.num_window_freed - self.owed_freed, False
                    else:
                        owed = self._running_blocks_owed()
                # The request's pages after this chunk bound the blocks it takes from the free queue.
                if not exact and kv.pool.free_queue.num_free - (reserve + owed + own) < pages:
                    owed, exact = self._running_blocks_owed(num_before) + step_own, True
                reserve += owed + own
            if type(hits) is TierHits or type(hits) is GroupTierHits:
                if not self._admit_loading(req, hits, num_hit, num_new, reserve):
                    break
                continue
            la = _lookahead(req, done + num_hit + num_new, lookahead, cfg.max_model_len) if lookahead else 0
            new_blocks = (kv.allocate_slots(req, num_new + la, hits, num_hit, reserve, num_draft_tokens=la)
                          if la else None)
            if new_blocks is None:
                new_blocks = kv.allocate_slots(req, num_new, hits, num_hit, reserve)
            if new_blocks is None and done:
                # Its held blocks cover a chunk (_admit_loading): never stuck behind its own hold.
                num_new = min(num_new, len(kv.req_to_blocks[req.request_id]) * kv.block_size - done)
                new_blocks = kv.allocate_slots(req, num_new)
            if new_blocks is None:
                break
            if done:
                loaded.pop(0)
            else:
                waiting.pop()
            if not done:
                kv.record_prefix_query(req.num_tokens, num_hit)
                if kv.host is not None:
                    kv.host.stats.queries += req.num_tokens
            if req.prefix_hit_tokens < 0:
                req.prefix_hit_tokens = num_hit
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            req.waited_s += now - req.queued_time
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = done + num_hit + num_new
            if req.num_computed_tokens < req.num_tokens:
                self._partial.append(req)
            running.append(req)
            rid = req.request_id
            req.fast_decode_limit = _fast_decode_limit(kv, rid)
            if no_evict:
                owed += own
                step_own += own
                if bounded and not kv._one_table:  # one table: it holds its pages
                    held_short += max(0, own + pages - kv.num_held_blocks(rid)) - own
            if tables:
                new_reqs.append(NewRequestData(rid, list(req.all_token_ids), req.num_prompt_tokens,
                                               req.sampling_params, kv.get_block_ids(rid), done + num_hit))
            else:  # executor_reads_tables False: its own list, no ids
                new_reqs.append(NewRequestData(rid, req.all_token_ids, req.num_prompt_tokens,
                                               req.sampling_params, _NO_IDS, done + num_hit))
            num_scheduled[rid] = num_new
            budget -= num_new
            if ranks > 1:
                self._adp_rank[rid] = rank
                rank_seqs[rank] += 1
                rank_room[rank] -= num_new
                rank_tokens[rank] += req.num_prompt_tokens
        if bounded and owed >= 0:
            self.owed_bound = owed + held_short
            self.owed_freed = kv.num_window_freed
        return budget

    def _rank_loads(self, ranks: int, num_scheduled: dict[str, int]) -> tuple[list[int], list[int], list[int]]:
        """Per attention-DP rank: running requests, step tokens left (its share of max_num_batched_tokens less
        what its running requests take this step) and active prompt tokens (TensorRT-LLM's balance key)."""
        rank_of = self._adp_rank
        running = self.running
        if len(rank_of) > 2 * len(running) + 256:  # forget requests that left
            live = {r.request_id for r in running}
            self._adp_rank = rank_of = {i: k for i, k in rank_of.items() if i in live}
        seqs, tokens = [0] * ranks, [0] * ranks
        room = [self.config.max_num_batched_tokens // ranks] * ranks
        for r in running:
            rid = r.request_id
            k = rank_of.get(rid)
            if k is None:  # admitted on another path: the rank with the fewest running requests
                k = rank_of[rid] = min(range(ranks), key=lambda j: (seqs[j], j))
            seqs[k] += 1
            tokens[k] += r.num_prompt_tokens
            room[k] -= num_scheduled.get(rid, 0)
        return seqs, room, tokens

    def _peak_blocks(self, req: Request) -> int:
        """Blocks req holds at its peak (its prompt and max_tokens less the last token, add_request's peak).

        Kept on the request with this scheduler as its owner (its prompt, max_tokens and this scheduler's
        layout do not change while it runs here; a disaggregated hand-off makes it again at the next owner).
        """
        kv = self.kv
        n = req.num_prompt_tokens
        peak = max(n, min(n + req.max_tokens - 1, self.config.max_model_len - 1))
        req.peak_blocks = pages = max_pages(peak, kv.block_size, kv.group_windows, kv.max_step_tokens)
        req.peak_owner = self.peak_key
        return pages

    def _running_blocks_owed(self, count: int | None = None) -> int:
        """Blocks the running requests (the first count of them) still need to reach their peaks
        (guaranteed_no_evict's reservation).

        Summed at admitting steps over thousands of running requests: each request's peak is read from
        the request where this scheduler made it, else made here.
        """
        kv = self.kv
        total = 0
        if self.owed_counts is not None:
            got = self.owed_counts(len(self.running) if count is None else min(count, len(self.running)))
            if got is not None:
                return got
        running = self.running if count is None or count >= len(self.running) else self.running[:count]
        if kv._one_table:
            tables = kv.req_to_blocks
            key = self.peak_key
            for r in running:
                peak = r.peak_blocks if r.peak_owner == key else self._peak_blocks(r)
                held = len(tables.get(r.request_id, _NO_BLOCKS))
                if peak > held:
                    total += peak - held
            return total
        for r in running:
            peak = r.peak_blocks if r.peak_owner == self.peak_key else self._peak_blocks(r)
            total += max(0, peak - kv.num_held_blocks(r.request_id))
        return total

    def _admit_loading(self, req: Request, hits: TierHits, num_hit: int, num_new: int, reserve: int) -> bool:
        """Admit req's hits with host-tier loads; it waits in self.loading, computing nothing yet.

        The first chunk's blocks come too (as drafts: not registered before they are computed),
        so once loaded it can always run a chunk on what it holds.
        """
        kv = self.kv
        if kv.allocate_slots(req, num_new, hits, num_hit, reserve, num_draft_tokens=num_new) is None:
            return False
        self.waiting.pop()
        external = hits.host_tokens if type(hits) is GroupTierHits else len(hits.host) * kv.block_size
        kv.record_prefix_query(req.num_tokens, num_hit - external)
        kv.host.stats.queries += req.num_tokens
        if req.prefix_hit_tokens < 0:
            req.prefix_hit_tokens = num_hit
        req.num_computed_tokens = num_hit
        self.loading[req.request_id] = req
        return True

    def _finish_loads(self, job_ids: list[int]) -> None:
        """Loads done: their requests are admitted next (self.loaded), their KV in place."""
        self.loaded += [self.loading.pop(rid) for rid in self.kv.complete_loads(job_ids) if rid in self.loading]

    def _preempt(self, req: Request, now: float, computed: int | None = None) -> None:
        """Recompute-style preemption: free all blocks, requeue at the front."""
        self.kv.free(req, computed)
        self._dropped.pop(req.request_id, None)
        req.spec_token_ids = []
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.preempted_times.append(now)
        req.queued_time = now  # running time does not age it
        self.num_preemptions += 1
        self.waiting.prepend(req)

    # ------------------------------------------------------------------ speculation
    def _release_rejected(self, req: Request) -> None:
        """Free blocks only rejected drafts took; tell the executor."""
        n = self.kv.trim(req, req.num_computed_tokens)
        if n:
            rid = req.request_id
            self._dropped[rid] = self._dropped.get(rid, 0) + n
            _refresh_fast_decode_limit(self.kv, req)
