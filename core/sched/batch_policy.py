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
- `mixed` with a batch wait (SchedulerConfig.batch_wait_iters / batch_wait_tokens_ratio; TensorRT-LLM's
  `batch_wait_timeout_iters` / `batch_wait_max_tokens_ratio`, both 0 by default there and here): while
  requests decode, new prompts are held back from the step until they have waited that many steps or
  the step's tokens (the held prompts' whole lengths plus one a decode) reach ratio x the step budget
  (MixedBatchWait).
- `mixed` with an attention-DP balance (SchedulerConfig.adp_balance_iters / adp_batching_wait_iters over
  adp_ranks ranks; TensorRT-LLM's `attention_dp_config` `enable_balance`, `timeout_iters`,
  `batching_wait_iters`): new prompts are held until every rank has one, or a step count runs out
  (AdpBalance).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from twinserve.core.errors import InvalidConfigError
from twinserve.core.request import Request
from twinserve.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from twinserve.core.sched.step_parts import _chunk, _fast_decode_limit, _lookahead

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

    def advance(self, k: int, running: int) -> None:
        """k decode steps of `running` requests ran without schedule() (nothing waited): a policy that
        counts steps counts them (Scheduler.advance_recv)."""


class MixedBatches:
    """vLLM V1: one budget, running requests first, then admissions, prefill and decode together."""

    name = "mixed"

    def schedule(self, sched: Scheduler, now: float) -> SchedulerOutput:
        """A mixed step."""
        return sched.schedule_batch(now)

    def advance(self, k: int, running: int) -> None:
        """Nothing counted."""


class PrefillFirst:
    """SGLang: a step prefills only when anything can prefill; otherwise it decodes every running request."""

    name = "prefill_first"

    def advance(self, k: int, running: int) -> None:
        """Nothing counted."""

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
            c_blocks.append(sched._table_ids(new_blocks))
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


class MixedBatchWait(MixedBatches):
    """`mixed` steps whose admissions wait while requests decode, as TensorRT-LLM's batch waiting does.

    TensorRT-LLM's PyTorch executor (tensorrt_llm/_torch/pyexecutor/py_executor.py, `_schedule` and
    `_waiting_requests`): when a step's schedule holds context requests *and* generation requests (not
    under attention DP), the context requests are dropped from the step unless
    `batch_wait_iters_count >= batch_wait_timeout_iters` or the step's tokens (each context request's
    whole prompt, `len(get_tokens(0))`, plus one a generation request and its drafts)
    `>= batch_wait_max_tokens_ratio * max_num_tokens`. A held step adds one to the count; a released one
    zeroes it; a step with no context or no generation request leaves it as it is.

    Here the context requests are the waiting requests `_admit` would take first (queue order, each
    whole prompt while it fits the budget left by the decodes, up to the sequence cap; a chunked one
    with its chunk) and the generation requests the running decodes. Not modelled: a running prompt
    part-way through its chunks is never held (TensorRT-LLM would hold it too), and the KV room an
    admission needs is not asked before counting a held step. Its own type, so the simulators' decode
    fast paths, which admit without the batch policy (sim/cluster.py `_join_step`), leave it alone.
    """

    name = "mixed"

    def __init__(self, iters: int, ratio: float) -> None:
        self.iters = iters
        self.ratio = ratio
        self.count = 0  # TensorRT-LLM's batch_wait_iters_count

    def schedule(self, sched: Scheduler, now: float) -> SchedulerOutput:
        """A mixed step, without its admissions while the wait holds."""
        if sched.waiting and self._holds(sched):
            return sched.schedule_batch(now, admit=False)
        return sched.schedule_batch(now)

    def _holds(self, sched: Scheduler) -> bool:
        """Whether this step's admissions wait (and the count, as TensorRT-LLM keeps it)."""
        decodes = sum(1 for r in sched.running if not is_prefilling(r))
        if not decodes:
            return False  # "if no generation requests, no need to wait, to avoid dead waiting"
        cfg = sched.config
        budget = cfg.max_num_batched_tokens
        room = budget - len(sched.running)
        seats = cfg.max_num_seqs - len(sched.running)
        prompt_tokens = 0
        for req in sched.waiting:
            if room <= 0 or seats <= 0:
                break
            need = req.num_tokens - req.num_computed_tokens
            if need > room:
                if not cfg.enable_chunked_prefill:
                    break
                need = room
            prompt_tokens += need
            room -= need
            seats -= 1
        if not prompt_tokens:
            return False  # no context request this step
        if self.count >= self.iters or prompt_tokens + decodes >= self.ratio * budget:
            self.count = 0
            return False
        self.count += 1
        return True


class AdpBalance(MixedBatches):
    """`mixed` steps whose admissions wait for every attention-DP rank to have a new prompt, as
    TensorRT-LLM's attention-DP balance does.

    TensorRT-LLM's PyTorch executor (tensorrt_llm/_torch/pyexecutor/py_executor.py `_schedule` and
    `_balance_adp_requests`, in 1.1 and 1.2; the same rule in later trees' scheduler), every step with
    `enable_attention_dp` and `attention_dp_config.enable_balance`: each rank's scheduled context and
    generation request counts are all-gathered; if every rank has a free slot (generation requests <
    max_batch_size) and a context request, the waiting count is zeroed and, when every rank also has a
    generation request, the contexts wait `batching_wait_iters` steps more (a count of its own, zeroed
    when they go); otherwise the waiting count goes up by one and the contexts are held, unless it
    reaches `timeout_iters` or some rank has no generation request, when it is zeroed and they go.
    The count runs every step, contexts or not: a lone prompt waits until the count next reaches
    timeout_iters, anywhere from 1 to timeout_iters steps.

    Here the attention-DP ranks are one pooled scheduler (sim/build.py: budget and sequence cap are
    `ranks` x a rank's), so the policy keeps which rank each request is on: a new request goes to the
    rank with the fewest active (waiting or running) requests among those below the even share
    max(ceil(active + new) / ranks, the fullest rank's), the lowest rank first on a tie, as
    executor_request_queue.py `_schedule_attention_dp_requests` / `_balance_requests_across_ranks` place
    them (they order the ranks by active tokens first: not modelled, the count decides). A rank has a
    context request when one of its waiting requests fits its share of the budget beside its decodes
    (chunked prefill: any room), a free slot while its decodes are fewer than its share of the sequence
    cap, and a generation request when one of its requests decodes or it has none at all
    (`_pad_attention_dp_dummy_request` gives an empty rank a dummy one). On release, the pooled
    scheduler admits in queue order within the pooled budget, not each rank within its own. Not
    modelled, as in MixedBatchWait: a running prompt part-way through its chunks is never held. Decode
    steps the simulators run as windows without schedule() (nothing waiting, every rank decoding or
    empty) are counted through advance(). Its own type, so the simulators' join steps and lazy
    decodes, which admit without the batch policy, leave it alone.
    """

    name = "mixed"

    def __init__(self, ranks: int, timeout_iters: int, batching_wait_iters: int = 0) -> None:
        self.ranks = ranks
        self.timeout_iters = timeout_iters
        self.batching_wait_iters = batching_wait_iters
        self.count = 0  # TensorRT-LLM's adp_ctx_waiting_iters_count
        self.batching_count = 0  # adp_ctx_batching_wait_iters_count
        self.rank_of: dict[str, int] = {}  # request id -> its attention-DP rank

    def schedule(self, sched: Scheduler, now: float) -> SchedulerOutput:
        """A mixed step, without its admissions while the balance holds."""
        if self._holds(sched) and sched.waiting:
            return sched.schedule_batch(now, admit=False)
        return sched.schedule_batch(now)

    def advance(self, k: int, running: int) -> None:
        """k steps with nothing waiting: every rank decodes or is empty (a dummy generation request), so
        the waiting count goes up by one a step and back to 0 at timeout_iters."""
        if k > 0 and self.timeout_iters > 0:
            self.count = (self.count + k) % self.timeout_iters

    def _holds(self, sched: Scheduler) -> bool:
        """Whether this step's admissions wait, the counts kept as TensorRT-LLM keeps them."""
        ranks = self.ranks
        rank_of = self.rank_of
        cfg = sched.config
        gen = [0] * ranks
        active = [0] * ranks
        for r in sched.running:
            k = rank_of.get(r.request_id)
            if k is None:  # admitted without passing the policy: placed as a new request
                k = rank_of[r.request_id] = self._place(active, max(-(-(sum(active) + 1) // ranks), max(active)))
            active[k] += 1
            if not is_prefilling(r):
                gen[k] += 1
        waiting = sched.waiting
        if waiting:
            new: list[Request] = []
            for r in waiting:
                k = rank_of.get(r.request_id)
                if k is None:
                    new.append(r)
                else:
                    active[k] += 1
            if new:
                share = max(-(-(sum(active) + len(new)) // ranks), max(active))  # fixed before placing
                for r in new:
                    rank_of[r.request_id] = self._place(active, share)
                if len(rank_of) > 4 * (len(sched.running) + len(waiting)) + 256:  # forget finished requests
                    live = {r.request_id for r in sched.running} | {r.request_id for r in waiting}
                    self.rank_of = rank_of = {i: k for i, k in rank_of.items() if i in live}
        all_gen = all(g > 0 or a == 0 for g, a in zip(gen, active))
        seats = cfg.max_num_seqs // ranks
        all_free = all(g < seats for g in gen)
        budget = cfg.max_num_batched_tokens // ranks
        chunked = cfg.enable_chunked_prefill
        has_ctx = [False] * ranks
        missing = ranks
        for r in waiting:
            k = rank_of[r.request_id]
            if has_ctx[k]:
                continue
            room = budget - gen[k]
            if room > 0 and (chunked or r.num_tokens - r.num_computed_tokens <= room):
                has_ctx[k] = True
                missing -= 1
                if not missing:
                    break
        if all_free and not missing:  # every rank has a free slot and a context request
            self.count = 0
            if all_gen:
                if self.batching_count < self.batching_wait_iters:
                    self.batching_count += 1
                    return True
                self.batching_count = 0
            return False
        self.count += 1
        if self.count >= self.timeout_iters or not all_gen:
            self.count = 0
            return False
        return True

    def _place(self, active: list[int], share: int) -> int:
        """The rank a new request goes to (counted into `active`): the fewest active requests among
        the ranks below the even share, lowest first."""
        best = min(range(self.ranks), key=lambda k: (active[k] >= share, active[k], k))
        active[best] += 1
        return best


BATCH_POLICIES: dict[str, type] = {"mixed": MixedBatches, "prefill_first": PrefillFirst}


def make_batch_policy(name: str, batch_wait_iters: int = 0, batch_wait_tokens_ratio: float = 0.0,
                      adp_ranks: int = 1, adp_balance_iters: int = 0, adp_batching_wait_iters: int = 0
                      ) -> BatchPolicy:
    """The batch policy registered as `name` (`mixed` with an attention-DP balance over more than one rank:
    AdpBalance; else with a batch wait: MixedBatchWait, which TensorRT-LLM runs only without attention DP)."""
    try:
        cls = BATCH_POLICIES[name]
    except KeyError:
        raise InvalidConfigError("batch_policy", name, ", ".join(repr(n) for n in BATCH_POLICIES)) from None
    if cls is MixedBatches and adp_ranks > 1 and adp_balance_iters > 0:
        return AdpBalance(adp_ranks, adp_balance_iters, adp_batching_wait_iters)
    if cls is MixedBatches and (batch_wait_iters > 0 or batch_wait_tokens_ratio > 0):
        return MixedBatchWait(batch_wait_iters, batch_wait_tokens_ratio)
    return cls()
