"""The simulated executor: prices each SchedulerOutput with a cost model and 'samples' tokens."""

from __future__ import annotations

from itertools import chain
from typing import Callable, Iterable

from twinserve.core.errors import TwinserveError
from twinserve.core.sched.output import ModelRunnerOutput, SchedulerOutput

from twinserve.backends.sim.catalog import ModelSpec
from twinserve.backends.sim.cost_model import CostModel, DraftModelSteps, WorkTotals
from twinserve.backends.sim.fitted import RANGE_DIMS
from twinserve.backends.sim.spec import SpecAcceptance

DEFAULT_TOKEN = 1
_INF = float("inf")


class StepTimeError(TwinserveError, ValueError):
    """A step priced NaN, infinite or negative: raised instead of letting the clock stall."""

    def __init__(self, cost_model: str, seconds: float, features: str) -> None:
        self.cost_model = cost_model
        self.seconds = seconds
        self._keep_args(f"cost model {cost_model} priced a step ({features}) at {seconds!r} s; a step needs a "
                        "finite, non-negative time: check the cost model's knobs (an efficiency near 0 or an "
                        "overhead near the float limit overflows)", cost_model, seconds, features)


class SimExecutor:
    """Keeps per-request progress from the scheduler outputs, as a model runner must.

    Sampled ids are the workload's, never EOS, so the core's max_tokens stop sets the output length.
    """

    def __init__(self, cost_model: CostModel, window: int | None = None) -> None:
        self.cost_model = cost_model
        # req_id -> [known sequence length, prompt length]
        self.state: dict[str, list[int]] = {}
        self.tokens: dict[str, int] = {}
        self.totals = WorkTotals()
        # The sliding window whose reads the totals count (MBU): given, else the cost model's ModelSpec's
        # (a profile's `model` is only a name: its builder passes the window).
        if window is None:
            model = getattr(cost_model, "model", None)
            window = WorkTotals.window_of(model) if isinstance(model, ModelSpec) else 0
        self.totals.window = window
        self.last_features: tuple[int, int, int, float, int, int] = (0, 0, 0, 0.0, 0, 0)
        # wake_after's (factor, extra seconds) of the next steps, last step first; empty when awake.
        self._wake: list[tuple[float, float]] = []
        self._wake_after = getattr(cost_model, "wake_after", None)
        # A profile's fitted maxima (RANGE_DIMS): steps beyond count in totals.beyond_fit_*, so a
        # study can say how much time was extrapolated. None: not recorded.
        top = getattr(cost_model, "shape_range", None) or {}
        self.fit_range_max = tuple(top.get(d, float("inf")) for d in RANGE_DIMS) if top else None
        # Speculative decoding: a verify row is priced as the (k + 1)-token chunk the engine runs, or,
        # by a profile calibrated on verify steps (prices_verify), as k + 1 decode rows at its context
        # (the same matmul rows, each attending to the context) plus its verify_time (twin/verifyfit.py).
        self.spec: SpecAcceptance | None = None
        # Whether a step holding this many requests proposes drafts (SpeculativeConfig.active, as the
        # real model runner asks it of its batch: none at disable_by_batch_size or more).
        self.spec_active: Callable[[int], bool] = lambda n: True
        # method draft_model: the draft model's forwards, added to every step's time; seconds they took.
        self.draft: DraftModelSteps | None = None
        self.draft_time = 0.0

    @property
    def waking(self) -> bool:
        """True while steps after an idle gap still cost extra (fast-forward windows wait)."""
        return bool(self._wake)

    def idle(self, seconds: float) -> None:
        """The engine idled this long: the next steps cost the model's wake-up price."""
        if self._wake_after is not None and seconds > 0.0:
            self._wake = self._wake_after(seconds)[::-1]

    def register(self, req_id: str, token_id: int) -> None:
        """Set the token id a request samples at every step."""
        self.tokens[req_id] = token_id

    def forget(self, req_id: str) -> None:
        """Drop what is known about a finished request."""
        self.tokens.pop(req_id, None)
        self.state.pop(req_id, None)
        if self.spec is not None:
            self.spec.forget(req_id)

    def execute(self, so: SchedulerOutput, decodes: tuple[int, int] | None = None,
                spec_rows: tuple | None = None) -> ModelRunnerOutput:
        """Advance every scheduled request, price the step, sample for requests at their end.

        decodes: (count, summed context) of plain decodes scheduled apart from so (a join step:
        core.sched.fast_forward.schedule_decode_half with known=self.state, which advanced their
        known lengths), priced in this step with so's requests; their tokens are not in the output
        (the caller appends them).
        spec_rows: drafting decodes scheduled apart from so (the cluster's drafting join step,
        sim/spec_window.py), verify_step_price's arguments for them: (features, catch-up features or None,
        verifies, drafts verified, drafting sequences, their context after the catch-up), priced in this
        step with so's requests (their acceptances were drawn and their tokens are appended by the caller).
        """
        state = self.state
        for rid in so.finished_req_ids:
            state.pop(rid, None)
        for rid in so.preempted_req_ids:
            state.pop(rid, None)
        num_sched = so.num_scheduled_tokens
        tokens = self.tokens
        sampled: dict[str, list[int]] = {}
        pt = ps = pc = ds = dc = 0
        pa = 0.0
        for new in so.scheduled_new_reqs:
            state[new.req_id] = [len(new.token_ids), new.num_prompt_tokens]
        cached = so.scheduled_cached_reqs
        # Running requests first, then new ones: (id, tokens already in the KV cache).
        pairs = chain(zip(cached.req_ids, cached.num_computed_tokens),
                      ((new.req_id, new.num_computed_tokens) for new in so.scheduled_new_reqs))
        spec = self.spec
        drafts = so.scheduled_spec_decode_tokens
        if spec is not None or drafts or self.draft is not None:
            if decodes is not None:
                raise ValueError("a join step's decodes are priced only without speculation")
            return self._execute_spec(so, pairs, spec, drafts, spec_rows)
        for rid, c in pairs:
            s = state[rid]
            q = num_sched[rid]
            if q == 1 and c >= s[1]:
                ds += 1
                dc += c
            else:
                pt += q
                ps += 1
                pc += c
                pa += q * (c + q * 0.5)
            if c + q >= s[0]:
                s[0] += 1
                sampled[rid] = [tokens.get(rid, DEFAULT_TOKEN)]
        if decodes is not None:
            num, context = decodes
            ds += num
            dc += context
        return self._finish(sampled, pt, ps, pc, pa, ds, dc)

    def _execute_spec(self, so: SchedulerOutput, pairs: Iterable[tuple[str, int]],
                      spec: SpecAcceptance | None, drafts: dict[str, list[int]],
                      spec_rows: tuple | None = None) -> ModelRunnerOutput:
        """execute() for steps that verify drafts or must propose them."""
        state, num_sched, tokens = self.state, so.num_scheduled_tokens, self.tokens
        sampled: dict[str, list[int]] = {}
        proposals: dict[str, list[int]] = {}
        pt = ps = pc = ds = dc = nv = nvd = 0
        pa = 0.0
        as_decode = getattr(self.cost_model, "prices_verify", False)
        draft = self.draft
        proposing = spec is not None and self.spec_active(len(state))
        drafting = draft is not None and self.spec_active(len(state))
        # The draft's catch-up forward (its features) and its drafting sequences.
        d_pt = d_ps = d_pc = d_ds = d_dc = d_n = d_ctx = 0
        d_pa = 0.0
        for rid, c in pairs:
            s = state[rid]
            q = num_sched[rid]
            nd = len(drafts.get(rid, ())) if drafts else 0
            if nd:
                nv += 1
                nvd += nd
            if q == 1 and c >= s[1]:
                ds += 1
                dc += c
            elif as_decode and nd and q == nd + 1 and c >= s[1]:
                ds += q
                dc += q * c
            else:
                pt += q
                ps += 1
                pc += c
                pa += q * (c + q * 0.5)
            m = q  # tokens the draft catches up on: what the target verified
            if c + q >= s[0] + nd:
                n = 1 + (spec.accepted(rid, nd) if nd and spec is not None else 0)
                s[0] += n
                tok = tokens.get(rid, DEFAULT_TOKEN)
                sampled[rid] = [tok] * n
                if proposing:
                    proposals[rid] = [tok] * spec.k
                # Verified: the n - 1 accepted drafts and the token before them; drafting adds the new one.
                m = q - nd + n - 1
                if drafting:
                    m += 1
                    d_n += 1
                    d_ctx += c + m
            if draft is not None:
                if m == 1:
                    d_ds += 1
                    d_dc += c
                else:
                    d_pt += m
                    d_ps += 1
                    d_pc += c
                    d_pa += m * (c + m * 0.5)
        if spec_rows is not None:
            (f_pt, f_ps, f_pc, f_pa, f_ds, f_dc), catch_up, f_nv, f_nvd, f_n, f_ctx = spec_rows
            pt += f_pt
            ps += f_ps
            pc += f_pc
            pa += f_pa
            ds += f_ds
            dc += f_dc
            nv += f_nv
            nvd += f_nvd
            if catch_up is not None:
                d_pt += catch_up[0]
                d_ps += catch_up[1]
                d_pc += catch_up[2]
                d_pa += catch_up[3]
                d_ds += catch_up[4]
                d_dc += catch_up[5]
                d_n += f_n
                d_ctx += f_ctx
        extra = draft.time((d_pt, d_ps, d_pc, d_pa, d_ds, d_dc), d_n, d_ctx) if draft is not None else 0.0
        verify_s = self.cost_model.verify_time(nv, nvd) if nv and as_decode else 0.0
        out = self._finish(sampled, pt, ps, pc, pa, ds, dc, extra, verify_s)
        out.spec_token_ids = proposals if proposing else None  # none the scheduler would drop, as the real runner
        return out

    def _finish(self, sampled: dict[str, list[int]], pt: int, ps: int, pc: int, pa: float, ds: int,
                dc: int, draft_s: float = 0.0, verify_s: float = 0.0) -> ModelRunnerOutput:
        """Price the step (plus draft_s of draft-model work and verify_s of verify rows), count it in
        the totals, return its output."""
        t = self.cost_model.step_time(pt, ps, pc, pa, ds, dc)
        if verify_s:
            t = max(t + verify_s, 0.0)
        if draft_s:
            t += draft_s
            self.draft_time += draft_s
        if self._wake:
            f, e = self._wake.pop()
            t = t * f + e
        if not 0.0 <= t < _INF:  # NaN fails too
            raise StepTimeError(self._model_name(), t, f"prefill: {pt} tokens in {ps} chunk(s); "
                                f"decode: {ds} sequence(s) over {dc} tokens of context")
        self._count(pt, ps, pc, pa, ds, dc, t)
        return ModelRunnerOutput(sampled, step_time=t)

    def _count(self, pt: int, ps: int, pc: int, pa: float, ds: int, dc: int, t: float) -> None:
        """Count one priced step in the totals (_finish's second half)."""
        w = self.totals
        w.num_steps += 1
        w.num_prefill_tokens += pt
        w.num_prefill_seqs += ps
        w.prefill_context += pc
        w.prefill_attn += pa
        w.num_decode_seqs += ds
        w.decode_context += dc
        if w.window:
            w.count_window_read(pc, ps, pt, dc, ds)
        w.busy_time += t
        if self.fit_range_max is not None and self.beyond_fit(pt, ps, pc, pa, ds, dc):
            w.beyond_fit_steps += 1
            w.beyond_fit_time += t
        self.last_features = (pt, ps, pc, pa, ds, dc)

    def verify_step_price(self, features: tuple[int, int, int, float, int, int], num_verify: int,
                          num_verify_drafts: int, catch_up: tuple[int, int, int, float, int, int] | None,
                          num_drafting: int, drafting_context: int) -> tuple[float, float]:
        """(seconds, of which the draft model's) of a drafting decode step given its features, as
        _execute_spec and _finish price it, without counting it (sim/spec_window.py prices a window's
        steps before it knows how many run; count_verify_steps counts those that did). No wake-up price:
        a window runs only while the executor is awake."""
        t = self.cost_model.step_time(*features)
        if num_verify and getattr(self.cost_model, "prices_verify", False):
            t = max(t + self.cost_model.verify_time(num_verify, num_verify_drafts), 0.0)
        draft_s = 0.0
        if self.draft is not None and catch_up is not None:
            draft_s = self.draft.time(catch_up, num_drafting, drafting_context)
            t += draft_s
        if not 0.0 <= t < _INF:
            raise StepTimeError(self._model_name(), t, f"a drafting decode step of {num_verify} sequence(s) "
                                f"verifying {num_verify_drafts} draft(s), features {features}")
        return t, draft_s

    def count_verify_steps(self, steps: Iterable[tuple[tuple[int, int, int, float, int, int], float, float]]
                           ) -> None:
        """Count steps priced by verify_step_price ((features, seconds, draft seconds) each), as _finish would."""
        for features, t, draft_s in steps:
            self.draft_time += draft_s
            self._count(*features, t)

    def beyond_fit(self, pt: int, ps: int, pc: int, pa: float, ds: int, dc: int) -> bool:
        """Whether a step with these features is larger than any the profile was fitted on."""
        top = self.fit_range_max
        return top is not None and (pt > top[0] or ps > top[1] or pc > top[2] or pa > top[3] or ds > top[4]
                                    or dc > top[5] or pt + ds > top[6] or dc > top[7] * ds)

    def decode_step_times(self, num_seqs: int, context: int, max_steps: int, start: float,
                          deadline: float) -> tuple[list[float], list[float]]:
        """Durations and end times of up to max_steps decode-only steps, each starting before deadline.

        The same floats stepping would produce.
        """
        fast = getattr(self.cost_model, "decode_step_times", None) if self.draft is None else None
        if fast is not None:  # the same loop, specialised by the cost model
            durations, ends = fast(num_seqs, context, max_steps, start, deadline)
        else:
            durations, ends = self._decode_step_times(num_seqs, context, max_steps, start, deadline)
        # A NaN or infinite duration carries to the last end; a negative one shows in the minimum.
        if ends and not (ends[-1] < _INF and min(durations) >= 0.0):
            bad = next((d for d in durations if not 0.0 <= d < _INF), ends[-1])
            raise StepTimeError(self._model_name(), bad, f"decode: {num_seqs} sequence(s) over {context} "
                                "tokens of context, or a decode step after it")
        return durations, ends

    def _model_name(self) -> str:
        return str(getattr(self.cost_model, "name", None) or type(self.cost_model).__name__)

    def _decode_step_times(self, num_seqs: int, context: int, max_steps: int, start: float,
                           deadline: float) -> tuple[list[float], list[float]]:
        step_time = self.cost_model.step_time
        # Without drafts (disable_by_batch_size) a draft model still catches up one token a sequence.
        draft_step = self.draft.cost.step_time if self.draft is not None else None
        durations: list[float] = []
        ends: list[float] = []
        t = start
        for _ in range(max_steps):
            if t >= deadline:
                break
            d = step_time(0, 0, 0, 0.0, num_seqs, context)
            if draft_step is not None:
                dd = draft_step(0, 0, 0, 0.0, num_seqs, context)
                self.draft_time += dd
                d += dd
            t = t + d
            durations.append(d)
            ends.append(t)
            context += num_seqs
        return durations, ends

    def advance_decode(self, req_ids: Iterable[str] | None, context: int, durations: list[float],
                       dropped: Iterable[str] = (), num: int = 0) -> None:
        """Account for decode steps run without execute() (fast-forward), as stepping would.

        req_ids None: num requests, whose known lengths the caller advanced already
        (core.sched.fast_forward.apply_decode_steps with known=self.state)."""
        state = self.state
        for rid in dropped:
            state.pop(rid, None)
        k = len(durations)
        n = num
        if req_ids is not None:
            n = 0
            for s in map(state.__getitem__, req_ids):
                s[0] += k
                n += 1
        w = self.totals
        w.num_steps += k
        w.num_decode_seqs += n * k
        # The batch's context grows by n a step.
        w.decode_context += context * k + n * k * (k - 1) // 2
        if w.window:
            w.count_window_decode(context, n, k)
        busy = w.busy_time
        for d in durations:
            busy += d
        w.busy_time = busy
        top = self.fit_range_max
        if top is not None and k:
            # Step j holds context + n j tokens: find the first j past the fitted context.
            limit = min(top[5], top[7] * n)
            if n > top[4] or n > top[6]:
                first = 0
            elif context + n * (k - 1) > limit:
                first = min(max(int((limit - context) // n) + 1, 0), k)
            else:
                first = k
            if first < k:
                w.beyond_fit_steps += k - first
                w.beyond_fit_time += sum(durations[first:])
        self.last_features = (0, 0, 0, 0.0, n, context + n * (k - 1))
