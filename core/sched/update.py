"""The scheduler's second half: a step's sampled tokens into requests, outputs and freed KV.

Several tokens may come back per request when drafts were verified; stop rules apply per
token, so a stop inside an accepted run ends the request there.
"""

from __future__ import annotations

from twinserve.core.errors import ComputedTokensError, ExecutorOutputError
from twinserve.core.request import FINISH_STATUS, FinishReason, Request, RequestStatus
from twinserve.core.sched.output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput

_STOP = FinishReason.STOP
_LENGTH = FinishReason.LENGTH
_RUNNING = RequestStatus.RUNNING
_new_object = object.__new__


def _check_stop(req: Request, token: int, n_out: int, max_model_len: int
                ) -> tuple[FinishReason | None, int | None]:
    """The full stop rule for the newest token: (finish reason, stop token)."""
    sp = req.sampling_params
    # Stops count only past min_tokens (the sampler masks them until then).
    if n_out > sp.min_tokens:
        if token == req.eos_token_id and not sp.ignore_eos:
            return _STOP, None
        if sp.stop_token_ids and token in sp.stop_token_ids:
            return _STOP, token
    if n_out >= req.max_tokens or len(req.all_token_ids) >= max_model_len:
        return _LENGTH, None
    return None, None


def _append_run(req: Request, tokens: list[int], now: float, max_model_len: int
                ) -> tuple[list[int], FinishReason | None, int | None]:
    """Append several tokens, stopping at the first that ends the request: (kept, reason, stop token)."""
    out_ids, all_ids, times = req.output_token_ids, req.all_token_ids, req.token_times
    stop_ids = req.stop_check_ids
    limit = req.stop_check_len
    count = 0
    for token in tokens:
        out_ids.append(token)
        all_ids.append(token)
        times.append(now)
        count += 1
        if token in stop_ids or len(all_ids) >= limit:
            reason, stop_reason = _check_stop(req, token, len(out_ids), max_model_len)
            if reason is not None:
                return (tokens if count == len(tokens) else tokens[:count]), reason, stop_reason
    return tokens, None, None


def _partial_sample(req: Request, tokens: list[int]) -> str:
    """Why tokens sampled for a step that stopped short of the request's last token cannot be kept."""
    # A step samples only when it computes up to the last known token (the model runner's sampling
    # rows, step_parts._lookahead); vLLM's runner likewise discards what a partial prefill samples.
    return (f"{len(tokens)} sampled token(s) for a step that computed its tokens only up to "
            f"{req.num_computed_tokens} of {len(req.all_token_ids)} (the prompt, or a resumed request's "
            "context, is still being prefilled: such a step samples nothing)")


class OutputUpdate:
    """Scheduler mixin: update_from_output, the drafts it verifies, and requests ended for a bad count."""

    # Whether a running request may hold drafts from an executor's proposal (set when one proposes).
    _drafts_held = False

    def _update_plain(self, reqs: list[Request], sampled: dict[str, list[int]], logprobs: dict | None,
                      now: float, outputs: list[EngineCoreOutput]) -> list[Request]:
        """update_from_output's loop for a step without drafts; the requests that finished."""
        max_model_len = self.config.max_model_len
        add_output = outputs.append
        finished: list[Request] = []
        new_output, Output = _new_object, EngineCoreOutput
        first = len(outputs)
        get_tokens = sampled.get
        for req in reqs:
            rid = req.request_id
            tokens = get_tokens(rid)
            if not tokens:
                continue  # a partial prefill
            if req.first_token_time is None:
                req.first_token_time = now
            out = new_output(Output)
            out.req_id = rid
            if len(tokens) == 1:
                token = tokens[0]
                req.output_token_ids.append(token)
                all_ids = req.all_token_ids
                all_ids.append(token)
                req.token_times.append(now)
                out.new_token_ids = tokens
                if token in req.stop_check_ids or len(all_ids) >= req.stop_check_len:
                    reason, stop_reason = _check_stop(req, token, len(req.output_token_ids), max_model_len)
                else:
                    reason = stop_reason = None
            else:
                out.new_token_ids, reason, stop_reason = _append_run(req, tokens, now, max_model_len)
            out.finish_reason = reason
            out.stop_reason = stop_reason
            out.new_logprobs = None  # set below when the step has logprobs (rare: off the hot loop)
            out.prompt_logprobs = None
            out.error = None
            out.num_draft_tokens = 0
            out.num_accepted_tokens = 0
            add_output(out)
            if reason is not None:
                req.status = FINISH_STATUS[reason]
                req.finish_reason = reason
                req.stop_reason = stop_reason
                req.finish_time = now
                finished.append(req)
        if logprobs is not None:
            for k in range(first, len(outputs)):
                out = outputs[k]
                lps = logprobs.get(out.req_id)
                # A stop inside a run of several tokens drops the logprobs past it.
                if lps is not None and len(sampled[out.req_id]) > 1 and len(lps) > len(out.new_token_ids):
                    lps = lps[:len(out.new_token_ids)]
                out.new_logprobs = lps
        return finished

    def _drop_partial_samples(self, scheduler_output: SchedulerOutput, sampled: dict[str, list[int]],
                              unverifiable: list[tuple[Request, str]]) -> dict[str, list[int]]:
        """sampled without the tokens of requests whose step stopped short of their last token (listed as
        ExecutorOutputErrors in unverifiable): a step samples only when it computes up to the last known
        token (the model runner's sampling rows; vLLM's runner likewise discards a partial prefill's sample).
        Only the step's chunked requests are looked at (the scheduler lists them), not every decode."""
        partial, self._step_partial = self._step_partial, []
        scheduled = scheduler_output.num_scheduled_tokens
        bad = set()
        for req in partial:
            rid = req.request_id
            tokens = sampled.get(rid)
            if (tokens and rid in scheduled and req.status is _RUNNING
                    and req.num_computed_tokens < len(req.all_token_ids)):
                unverifiable.append((req, _partial_sample(req, tokens)))
                bad.add(rid)
        return {k: v for k, v in sampled.items() if k not in bad} if bad else sampled

    def _drop_sampled_drafts(self, reqs: list[Request], sampled: dict[str, list[int]]) -> None:
        """Drafts held by requests this step sampled without verifying them (speculation was off:
        disable_by_batch_size, or a prefill-only step before it) were for tokens now sampled: drop them,
        or a later step verifies them again (issue 53 item 9: stale acceptance counts)."""
        for req in reqs:
            if req.spec_token_ids and sampled.get(req.request_id):
                req.spec_token_ids = []
        self._drafts_held = any(r.spec_token_ids for r in self.running)

    def _fail_stalled(self, now: float) -> None:
        """End running requests left with nothing to compute (no step would ever advance them), or with a
        negative count (a step would compute positions before the prompt: an executor indexing its block
        table with them reads and writes other blocks' KV)."""
        stalled, self._stalled = self._stalled, []
        for req in stalled:
            if req.status is not RequestStatus.RUNNING:
                continue
            if req.num_computed_tokens < 0:
                self._fail(req, req.num_computed_tokens, "the count is negative, so a step would compute positions "
                           "before the prompt; it was set wrong", now)
            else:
                self._fail(req, req.num_computed_tokens, "no token is left to compute and none was sampled: the "
                           "executor sampled nothing for a finished prompt, or the count was set wrong", now)

    def _fail(self, req: Request, computed: int, source: str, now: float) -> None:
        """End req with a ComputedTokensError (finish reason error); the engine carries on."""
        err = ComputedTokensError(req.request_id, computed, req.num_tokens, source)
        for out in self.abort_requests([req.request_id], FinishReason.ERROR, now):
            out.error = f"{type(err).__name__}: {err}"
            self.failed_outputs.append(out)

    def _fail_unverifiable(self, bad: list[tuple[Request, str]], scheduler_output: SchedulerOutput,
                           now: float, outputs: list[EngineCoreOutput]) -> None:
        """End requests whose step sent back tokens it cannot yield (more than a verify step can, or any for a
        partial prefill), with an ExecutorOutputError.

        Only their own state is in doubt (their tokens, and the KV their step wrote, which no other
        request reads before it is cached), so they end alone: the blocks their step would fill are
        uncached, as for an abort while a step is in flight, and the engine carries on.
        """
        self._in_flight = scheduler_output.num_scheduled_tokens
        try:
            for req, problem in bad:
                err = ExecutorOutputError(req.request_id, problem)
                for out in self.abort_requests([req.request_id], FinishReason.ERROR, now):
                    out.error = f"{type(err).__name__}: {err}"
                    outputs.append(out)
        finally:
            self._in_flight = None

    def _verify(self, req: Request, drafts: list[int], tokens: list[int]) -> tuple[int, int]:
        """Count a verification, roll back rejected drafts (len(tokens) - 1 accepted; checked by the caller)."""
        num_drafts = len(drafts)
        num_accepted = len(tokens) - 1
        req.num_computed_tokens -= num_drafts - num_accepted
        req.num_draft_tokens += num_drafts
        req.num_accepted_tokens += num_accepted
        self.spec_stats.observe(num_drafts, num_accepted)
        self.step_num_spec_reqs += 1
        self.step_num_draft_tokens += num_drafts
        self.step_num_accepted_tokens += num_accepted
        return num_drafts, num_accepted

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput, now: float
                           ) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply stop rules, free finished requests."""
        if model_runner_output.finished_loads:
            self._finish_loads(model_runner_output.finished_loads)
        sampled = model_runner_output.sampled_token_ids
        logprobs = model_runner_output.logprobs or None
        requests = self.requests
        max_model_len = self.config.max_model_len
        outputs: list[EngineCoreOutput] = []
        if self.failed_outputs:  # requests schedule() ended with an error
            outputs, self.failed_outputs = self.failed_outputs, outputs
        add_output = outputs.append
        finished: list[Request] = []
        new_output, Output = _new_object, EngineCoreOutput
        self._in_flight = None
        running = self.running
        if scheduler_output is self._whole_batch and len(running) == self._whole_batch_len:
            # None gone since: the step's requests, in order.
            reqs = running
        else:
            reqs = [r for r in map(requests.get, scheduler_output.num_scheduled_tokens)
                    if r is not None and r.status is _RUNNING]
        self._whole_batch = None
        verified = scheduler_output.scheduled_spec_decode_tokens
        proposed = model_runner_output.spec_token_ids
        rolled_back: list[Request] = []
        unverifiable: list[tuple[Request, str]] = []
        if self._step_partial:  # requests given a chunk short of their last token: they sample nothing
            sampled = self._drop_partial_samples(scheduler_output, sampled, unverifiable)
        self.step_num_spec_reqs = self.step_num_draft_tokens = self.step_num_accepted_tokens = 0
        if not verified and proposed is None:
            # No speculation this step: the plain loop, as before drafts (the decode hot path).
            finished = self._update_plain(reqs, sampled, logprobs, now, outputs)
            if self._drafts_held:
                self._drop_sampled_drafts(reqs, sampled)
            reqs = ()
        elif proposed is not None:
            self._drafts_held = True
        for req in reqs:
            rid = req.request_id
            tokens = sampled.get(rid)
            if not tokens:
                continue  # a partial prefill
            num_drafts = num_accepted = 0
            if verified:
                drafts = verified.get(rid)
                if drafts:
                    if len(tokens) > len(drafts) + 1:  # more than the accepted drafts and one token
                        unverifiable.append((req, f"{len(tokens)} sampled tokens for a step verifying "
                                                  f"{len(drafts)} draft(s) (at most {len(drafts) + 1})"))
                        continue
                    num_drafts, num_accepted = self._verify(req, drafts, tokens)
                    if num_accepted < num_drafts:
                        rolled_back.append(req)
            out_ids = req.output_token_ids
            all_ids = req.all_token_ids
            if req.first_token_time is None:
                req.first_token_time = now
            if len(tokens) == 1:
                token = tokens[0]
                out_ids.append(token)
                all_ids.append(token)
                req.token_times.append(now)
                # Quick stop check first (Request.stop_check_ids).
                if token in req.stop_check_ids or len(all_ids) >= req.stop_check_len:
                    reason, stop_reason = _check_stop(req, token, len(out_ids), max_model_len)
                else:
                    reason = stop_reason = None
                new_ids = tokens
            else:
                new_ids, reason, stop_reason = _append_run(req, tokens, now, max_model_len)
            # No __init__ (hot path): every field is set.
            out = new_output(Output)
            out.req_id = rid
            out.new_token_ids = new_ids
            out.finish_reason = reason
            out.stop_reason = stop_reason
            lps = logprobs.get(rid) if logprobs is not None else None
            # A stop inside an accepted run drops the tokens after it, and their logprobs.
            out.new_logprobs = lps[:len(new_ids)] if lps is not None and len(lps) > len(new_ids) else lps
            out.prompt_logprobs = None
            out.error = None
            out.num_draft_tokens = num_drafts
            out.num_accepted_tokens = num_accepted
            add_output(out)
            if reason is not None:
                req.status = FINISH_STATUS[reason]
                req.finish_reason = reason
                req.stop_reason = stop_reason
                req.finish_time = now
                finished.append(req)
            elif proposed is not None:
                req.spec_token_ids = proposed.get(rid) or []
            elif req.spec_token_ids:  # nothing proposed: the drafts held were for tokens now sampled
                req.spec_token_ids = []
        if unverifiable:
            self._fail_unverifiable(unverifiable, scheduler_output, now, outputs)
        for req in rolled_back:
            if req.status is _RUNNING:
                self._release_rejected(req)
        if finished:
            for req in finished:
                del requests[req.request_id]
                self.kv.free(req)
                self.finished_req_ids.add(req.request_id)
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return outputs
