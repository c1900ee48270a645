"""The synchronous engine: validation, tokenization, the engine core, detokenization, n > 1.

LLM drives it in a loop; an async front end can drive step() from one thread while other
threads add and abort requests (every public method takes the engine's lock). The engine core
runs in this process or in its own (args.engine_core_mode); this front end is the same for both.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from twinserve.core.engine_core import StepStats
from twinserve.core.kv.groups import max_pages
from twinserve.core.errors import (EngineDeadError, InvalidConfigError, InvalidRequestError, InvalidSamplingParamsError,
                            PromptTooLongError)
from twinserve.core.request import FinishReason, Request
from twinserve.core.sampling_params import SamplingParams
from twinserve.core.sched.output import Logprob
from twinserve.backends.real.config import EngineArgs
from twinserve.core.kv.model_kv import with_model_kv
from twinserve.backends.real.core_client import (EngineCoreClient, InprocCoreClient, kv_group_windows,
                                                kv_sliding_window, scheduler_config_for)
from twinserve.backends.real.core_messages import CoreOutput
from twinserve.backends.real.detokenizer import IncrementalDetokenizer
from twinserve.backends.real.models.architectures import CausalLM
from twinserve.backends.real.models.config import model_context
from twinserve.backends.real.models.registry import ModelSource, resolve_model
from twinserve.backends.real.outputs import CompletionOutput, RequestMetrics, RequestOutput
from twinserve.backends.real.step_log import StepLog, StepRecord, extra_costs
from twinserve.backends.real.tokenizer import apply_chat_template, load_tokenizer

PromptType = str | list[int] | dict[str, Any]
# Sequences one request may fan out into (n): beyond this, adding the request alone would stall.
MAX_N = 4096
# cumulative: every output repeats all tokens so far (O(L) per step); delta: only the final
# output carries the cumulative lists, the others their new tokens; final_only: one output.
OUTPUT_KINDS = ("cumulative", "delta", "final_only")

# How long one step() waits for the core's next batch when the core runs in its own process.
_OUTPUT_POLL_S = 0.05


@dataclass(slots=True)
class _Child:
    """One of a request's n sequences, as the core sees it."""

    core_id: str
    index: int
    detok: IncrementalDetokenizer
    logprobs: list[Logprob] | None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    delta_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[Logprob] = field(default_factory=list)
    # Mirrored from the core's outputs (the core's Request may live in another process).
    output_token_ids: list[int] = field(default_factory=list)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    prefix_hit_tokens: int = -1
    num_preemptions: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    error: str | None = None


@dataclass(slots=True)
class _Parent:
    """A user request: its prompt and its children."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    arrival_time: float
    children: list[_Child]
    # One slot per prompt token when prompt logprobs were asked for (the first is always None).
    prompt_logprobs: list[Logprob | None] | None = None
    output_kind: str = "cumulative"


class LLMEngine:
    """Adds requests, steps the engine core, and returns incremental per-request outputs."""

    def __init__(self, args: EngineArgs, model: CausalLM | None = None, tokenizer: Any = None,
                 default_core_mode: str = "inproc", step_log: StepLog | None = None) -> None:
        self.args = args
        source: ModelSource | None = None
        if model is None:
            source = resolve_model(args.model)
        # The config first: an architecture or field the engine cannot run is the error to report,
        # not a tokenizer the folder lacks.
        cfg = model.config if model is not None else _peek_config(source)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(source, args.tokenizer)
        self.model_config = cfg  # the model's architecture (HF config), whichever process runs it
        self.model_name = source.name if source else args.model
        args.validate()
        self.max_model_len = args.max_model_len or cfg.max_position_embeddings
        context = model_context(cfg)
        if self.max_model_len > context:
            raise InvalidConfigError("max_model_len", self.max_model_len,
                                     f"at most {context}, the model's context length")
        self.vocab_size = cfg.vocab_size
        spec = args.speculative_config
        if spec is not None and spec.method == "draft_model":
            # Refused here, before any worker or process starts.
            from twinserve.backends.real.spec.draft_model import resolve_draft_model

            resolve_draft_model(spec.model, cfg, self.max_model_len, kv_sliding_window(cfg))
        self.eos_token_ids = list(cfg.eos_token_id) or (
            [self.tokenizer.eos_token_id] if getattr(self.tokenizer, "eos_token_id", None) is not None else [])
        self.core_mode = args.resolve_engine_core_mode(default_core_mode)
        backend = args.resolve_executor_backend()  # bad TP settings fail here, before any process starts
        # Grammar masks are applied where the model runs: another process compiles its own copy of
        # each grammar with the tokenizer it loads from args, so a tokenizer object given here
        # cannot be matched there (add_request refuses structured output in that case).
        self._masks_elsewhere = self.core_mode == "process" or backend == "mp"
        self._tokenizer_given = tokenizer is not None
        self.worker = None  # the in-process worker, when there is exactly one in this process
        self.executor = None
        self.core: EngineCoreClient
        if self.core_mode == "process":
            if model is not None:
                raise InvalidRequestError("engine_core_mode='process' needs a model path, not an in-memory "
                                          "model", param="engine_core_mode")
            from twinserve.backends.real.core_proc import MPCoreClient

            self.core = MPCoreClient(args, self.max_model_len, self.eos_token_ids, source)
        else:
            from twinserve.backends.real.core_build import build_engine_core

            core, self.executor, kv_bytes = build_engine_core(args, self.max_model_len, self.eos_token_ids,
                                                              model=model, source=source)
            self.worker = getattr(self.executor, "workers", [None])[0]
            self.core = InprocCoreClient(core, self.executor, kv_bytes)
        # With the model's KV groups, so the front end counts pages as the core does.
        self.scheduler_config = with_model_kv(scheduler_config_for(args, self.max_model_len, self.core.num_blocks),
                                              kv_group_windows(cfg))
        # Per-step shapes and phase times: streamed to args.step_log_path, or a log given by the
        # caller (calibrate, fidelity); disabled otherwise, so nothing grows and nothing is timed.
        self.step_log = step_log if step_log is not None else StepLog(args.step_log_path)
        self._last_step_end = 0.0
        self._busy_after_last_step = False
        # Engine core in its own process, log on: the (record, trace) of every core step the
        # last step() took (realrun reads them to replay the core's schedule).
        self.last_core_steps: list[tuple[StepRecord, Any]] = []
        try:
            self.set_step_log(self.step_log)
        except BaseException:
            self.core.shutdown()
            raise
        self._rng = random.Random(args.seed)
        torch.manual_seed(args.seed)
        self._parents: dict[str, _Parent] = {}
        self._child_to_parent: dict[str, _Parent] = {}
        self._lock = threading.RLock()
        self.last_stats: StepStats | None = None
        self.dead: BaseException | None = None
        self._grammars: Any = None
        self._grammars_lock = threading.Lock()

    @property
    def grammar_compiler(self) -> Any:
        """The structured-output compiler for this tokenizer (xgrammar is imported on first use)."""
        with self._grammars_lock:
            if self._grammars is None:
                from twinserve.backends.real.structured.compiler import GrammarCompilerCache

                self._grammars = GrammarCompilerCache(self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._grammars

    def set_step_log(self, step_log: StepLog) -> None:
        """Log steps to step_log from now on (a disabled log turns the phase timing off).

        With the engine core in its own process the switch is a message: steps the core ran
        before reading it are neither timed nor logged (call this while the engine is idle to
        log every step).
        """
        self.step_log = step_log
        self.last_core_steps = []
        self.core.set_step_log(step_log.enabled, step_log.record_schedule)

    def set_drafting(self, on: bool) -> bool:
        """Let a speculating engine draft (True) or propose nothing, so every step is plain (False);
        returns the previous setting."""
        workers = getattr(self.executor, "workers", None) or []
        runners = [getattr(w, "runner", None) for w in workers]
        if not runners or any(r is None for r in runners):
            raise InvalidConfigError("engine_core_mode", self.core_mode,
                                     "'inproc' with in-process workers (drafting is switched in the worker)")
        before = runners[0].drafting
        for r in runners:
            r.drafting = on
        return before

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (PrefixCacheBusyError while requests hold blocks)."""
        self.core.reset_prefix_cache()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
        """Build an engine, loading the model named by args.model."""
        return cls(args)

    # ------------------------------------------------------------------ requests
    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """A prompt as (text or None, token ids); typed errors for anything unusable."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise InvalidRequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'", param="prompt")
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt)["input_ids"]) if prompt else []
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise InvalidRequestError(f"prompt must be a string, a list of token ids or a dict, got "
                                  f"{type(prompt).__name__}", param="prompt")

    def chat_prompt(self, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        """A conversation rendered with the chat template, as a token-id prompt."""
        ids = apply_chat_template(self.tokenizer, messages, **kwargs)
        return {"prompt_token_ids": ids, "prompt": self.tokenizer.decode(ids)}

    def validate_prompt_ids(self, ids: list[int]) -> None:
        """Typed errors for an empty prompt, one over max_model_len, or ids outside the vocabulary."""
        if not ids:
            raise InvalidRequestError("the prompt is empty: give at least one token", param="prompt")
        if len(ids) > self.max_model_len:
            raise PromptTooLongError(f"prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}; "
                                     "shorten the prompt or raise max_model_len", len(ids), self.max_model_len)
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})",
                                      param="prompt")

    def _validate(self, request_id: str, ids: list[int], params: Any) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id must be a non-empty string", param="request_id")
        if request_id in self._parents:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", param="request_id")
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling_params must be SamplingParams, got {type(params).__name__}",
                                      param="sampling_params")
        params.validate()
        if params.n > MAX_N:
            raise InvalidSamplingParamsError("n", params.n, f"an integer in [1, {MAX_N}] (parallel samples of one "
                                             "request; each is a sequence of its own)")
        self.validate_prompt_ids(ids)
        cap = min(self.args.max_logprobs, self.vocab_size)  # --max-logprobs, and no more than the vocabulary
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > cap:
                raise InvalidSamplingParamsError(name, value, f"an integer in [0, {cap}] (the server's "
                                                 "--max-logprobs)")
        for name in ("allowed_token_ids",):
            bad = next((t for t in getattr(params, name) or () if t >= self.vocab_size), None)
            if bad is not None:
                raise InvalidSamplingParamsError(name, bad, f"token ids below the vocabulary size {self.vocab_size}")
        if params.logit_bias:
            bad = next((t for t in params.logit_bias if t >= self.vocab_size), None)
            if bad is not None:
                raise InvalidSamplingParamsError("logit_bias", bad,
                                                 f"token ids below the vocabulary size {self.vocab_size}")
        for t in params.stop_token_ids:
            if t >= self.vocab_size:
                raise InvalidSamplingParamsError("stop_token_ids", params.stop_token_ids,
                                                 f"token ids below the vocabulary size {self.vocab_size}")

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0,
                    output_kind: str = "cumulative", cache_salt: str | None = None) -> None:
        """Validate, tokenize and queue a request (n > 1 fans out into n core requests)."""
        params = params if params is not None else SamplingParams()
        if output_kind not in OUTPUT_KINDS:
            raise InvalidRequestError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}",
                                      param="output_kind")
        if isinstance(priority, bool) or not isinstance(priority, int) or not -2 ** 63 <= priority < 2 ** 63:
            raise InvalidRequestError(f"priority must be a 64-bit integer, got {priority!r}", param="priority")
        if priority != 0 and self.args.policy != "priority":
            # As vLLM: a priority that the queue would ignore is refused, not dropped.
            raise InvalidRequestError(f"priority={priority} needs priority scheduling; start the engine with "
                                      f"--policy priority (it runs --policy {self.args.policy})", param="priority")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise InvalidRequestError("cache_salt must be a non-empty string", param="cache_salt")
        text, ids = self.tokenize_prompt(prompt)
        spec = getattr(params, "structured_output", None)
        if spec is not None:
            if self._masks_elsewhere and self._tokenizer_given:
                raise InvalidRequestError(
                    f"{spec.param}: structured output with engine_core_mode='process' or worker processes "
                    "needs the tokenizer named by the engine args (the model runner's process compiles the "
                    "grammar with it), not a tokenizer object; use engine_core_mode='inproc' with "
                    "tensor_parallel_size=1", param=spec.param)
            if spec.compiled is None:  # the server compiles before this, off the engine loop
                self.grammar_compiler.compile(spec)
        with self._lock:
            self._check_alive()
            self._validate(request_id, ids, params)
            self._check_fits(len(ids), params)
            now = time.monotonic() if arrival_time is None else arrival_time
            children: list[_Child] = []
            extra_eos = [] if params.ignore_eos else self.eos_token_ids[1:]
            want_plp = params.prompt_logprobs is not None
            try:
                for i in range(params.n):
                    seed = params.seed + i if params.seed is not None else self._rng.getrandbits(62)
                    # Only the first child computes prompt logprobs: the prompt is the same for all.
                    child_params = params.clone(n=1, seed=seed, stop_token_ids=params.stop_token_ids + extra_eos,
                                                prompt_logprobs=params.prompt_logprobs if i == 0 else None)
                    core_id = request_id if params.n == 1 else f"{i}_{request_id}"
                    # Prompt logprobs need every prompt position computed: a unique salt keeps
                    # this request's prefix out of other requests' cache hits (as vLLM skips the cache).
                    salt = f"prompt-logprobs:{request_id}" if want_plp and i == 0 else cache_salt
                    req = Request(core_id, ids, child_params, arrival_time=now, priority=priority,
                                  cache_salt=salt,
                                  eos_token_id=self.eos_token_ids[0] if self.eos_token_ids else None)
                    self.core.add_request(req)
                    detok = IncrementalDetokenizer.for_prompt(self.tokenizer, ids, params.skip_special_tokens,
                                                              params.stop, params.include_stop_str_in_output)
                    children.append(_Child(core_id, i, detok, [] if params.logprobs is not None else None))
            except Exception:
                self.core.abort([c.core_id for c in children])
                raise
            parent = _Parent(request_id, text, ids, now, children,
                             [None] * len(ids) if want_plp else None, output_kind)
            self._parents[request_id] = parent
            for c in children:
                self._child_to_parent[c.core_id] = parent

    def abort_request(self, request_ids: str | list[str]) -> list[RequestOutput]:
        """End requests now (finish reason "abort"); their KV blocks are freed at once."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        with self._lock:
            now = time.monotonic()
            out = []
            for rid in ids:
                parent = self._parents.get(rid)
                if parent is None:
                    continue
                live = [c for c in parent.children if c.finish_reason is None]
                self.core.abort([c.core_id for c in live])
                for c in live:
                    c.finish_reason = FinishReason.ABORT
                out.append(self._make_output(parent, now, set(id(c) for c in live)))
            return out

    def _check_fits(self, n: int, params: SamplingParams) -> None:
        """The scheduler's KV check, here too, so a request the core would refuse never leaves the front end."""
        cfg = self.scheduler_config
        max_tokens = max(1, params.max_tokens if params.max_tokens is not None else cfg.max_model_len - n)
        peak = max(n, min(n + max_tokens - 1, cfg.max_model_len - 1))
        windows = [w or None for w in cfg.kv_groups] or [None]
        if max_pages(peak, cfg.block_size, windows, cfg.max_num_batched_tokens) > cfg.num_blocks:
            limit = cfg.num_blocks * cfg.block_size
            raise PromptTooLongError(
                f"request needs up to {peak} tokens of KV cache but the whole pool holds {limit} "
                f"({cfg.num_blocks} blocks of {cfg.block_size}); lower max_tokens or add blocks", peak, limit)

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(f"the engine failed earlier ({self.dead!r}); restart it")

    def has_unfinished_requests(self) -> bool:
        """True while any request is queued or running (or the core still owes an answer)."""
        return bool(self._parents) or self.core.has_pending()

    def get_num_unfinished_requests(self) -> int:
        """User requests not yet finished."""
        return len(self._parents)

    # ------------------------------------------------------------------ step
    def step(self) -> list[RequestOutput]:
        """Run one engine step; one RequestOutput per user request that changed."""
        with self._lock:
            self._check_alive()
            if not self.has_unfinished_requests():
                return []
            logging = self.step_log.enabled
            t0 = time.perf_counter() if logging else 0.0
            try:
                res = self.core.get_output(_OUTPUT_POLL_S)
            except EngineDeadError as e:
                self.dead = e
                raise
            except Exception as e:
                # Executor state and scheduler state may disagree now: refuse further work.
                self.dead = e
                raise EngineDeadError(f"engine step failed: {e!r}; restart the engine") from e
            if logging:
                self.last_core_steps = []
            if res is None:
                return []
            outputs = res.outputs
            stats = res.stats
            if stats is not None:
                self.last_stats = stats
            t_core = time.perf_counter() if logging else 0.0
            now = time.monotonic()
            changed: dict[str, tuple[_Parent, set[int]]] = {}
            stop_aborts: list[str] = []
            error_aborts: list[str] = []
            for o in outputs:
                parent = self._child_to_parent.get(o.req_id)
                if parent is None:
                    continue
                child = next(c for c in parent.children if c.core_id == o.req_id)
                try:
                    if o.prompt_logprobs is not None and parent.prompt_logprobs is not None:
                        first, records = o.prompt_logprobs
                        parent.prompt_logprobs[first:first + len(records)] = records
                    if self._apply(child, o):
                        stop_aborts.append(child.core_id)
                except Exception as e:  # noqa: BLE001 - e.g. detokenizing: this request alone ends
                    if child.finish_reason is None and o.finish_reason is None:
                        error_aborts.append(child.core_id)
                    child.finish_reason = FinishReason.ERROR
                    child.error = f"output processing failed: {type(e).__name__}: {e}"
                changed.setdefault(parent.request_id, (parent, set()))[1].add(id(child))
            if stop_aborts:
                self.core.abort(stop_aborts, reason=FinishReason.STOP)
            if error_aborts:
                self.core.abort(error_aborts, reason=FinishReason.ERROR)
            result = [self._make_output(p, now, touched) for p, touched in changed.values()
                      if p.output_kind != "final_only" or all(c.finish_reason is not None for c in p.children)]
            if logging and res.traces:
                self._log_core_steps(res.traces, time.perf_counter() - t_core)
            elif logging and stats is not None and self.core_mode == "inproc":
                self._log_step(stats, stats.start_time, t0, t_core, time.perf_counter())
            return result

    def _log_step(self, stats: StepStats, start: float, t0: float, t_core: float, t_end: float) -> None:
        """One step record: the shape the worker ran and the wall time of every phase (in-process core)."""
        log = self.step_log
        # Time requests waited between the last step's end and this one's start, if any were left.
        gap = t0 - self._last_step_end if self._busy_after_last_step else 0.0
        self._last_step_end = t_end
        core = self.core.core
        self._busy_after_last_step = core.has_unfinished_requests()
        ex = self.executor
        shape = ex.last_step_shape
        prepare, forward, sample = ex.last_step_timing if shape.num_new_tokens else (0.0, 0.0, 0.0)
        so = core.last_scheduler_output
        extra = extra_costs(shape, ex.last_comm_time if shape.num_new_tokens else 0.0)
        log.append(StepRecord(
            stats.step, start, list(shape.prefills), list(shape.decodes), stats.num_running,
            stats.num_waiting, stats.num_preempted, stats.schedule_time, prepare, forward, sample,
            stats.update_time, t_end - t_core, t_end - t0, gap,
            dict(so.num_scheduled_tokens) if log.record_schedule and so is not None else None,
            extra, stats.num_spec_reqs, stats.num_draft_tokens, stats.num_accepted_tokens))

    def _log_core_steps(self, traces: list[tuple[StepStats, Any]], output_s: float) -> None:
        """Step records from the core process's traces (its clock, its gaps; see step_log.py)."""
        log = self.step_log
        made = []
        last = len(traces) - 1
        for i, (stats, tr) in enumerate(traces):
            rec = StepRecord(
                stats.step, stats.start_time, [(q, c) for q, c in tr.prefill_chunks], tr.decode_context_lens,
                stats.num_running, stats.num_waiting, stats.num_preempted, stats.schedule_time, tr.prepare_s,
                tr.forward_s, tr.sample_s, stats.update_time,
                # This front end's output processing ran once for the steps it took together.
                output_s if i == last else 0.0, tr.step_time_s, tr.gap_s,
                tr.scheduled if log.record_schedule else None, tr.extra or {},
                stats.num_spec_reqs, stats.num_draft_tokens, stats.num_accepted_tokens)
            log.append(rec)
            made.append((rec, tr))
        self.last_core_steps = made

    def _apply(self, child: _Child, o: CoreOutput) -> bool:
        """Fold one core output into a child; True if a stop string ended it (core must abort)."""
        new_ids = o.new_token_ids
        stopped = False
        if len(new_ids) > 1 and child.detok.stop:
            # Several tokens in one step (accepted drafts): fed one by one as plain decoding
            # would, so a stop string ends the output at the token that completed it.
            for i, tok in enumerate(new_ids):
                if child.detok.add_tokens([tok]):
                    new_ids, stopped = new_ids[:i + 1], True
                    break
        elif new_ids:
            stopped = child.detok.add_tokens(new_ids)
        child.delta_ids.extend(new_ids)
        child.output_token_ids.extend(new_ids)
        child.num_draft_tokens = o.num_draft_tokens
        child.num_accepted_tokens = o.num_accepted_tokens
        child.first_scheduled_time = o.first_scheduled_time
        child.first_token_time = o.first_token_time
        child.prefix_hit_tokens = o.prefix_hit_tokens
        child.num_preemptions = o.num_preemptions
        if o.new_logprobs and child.logprobs is not None:
            # One record per token kept: a stop string inside an accepted run cut the ids above.
            child.delta_logprobs.extend(o.new_logprobs[:len(new_ids)])
        if o.error is not None:
            child.error = o.error
        if stopped:
            child.finish_reason, child.stop_reason = FinishReason.STOP, child.detok.stop_hit
            return o.finish_reason is None
        if o.finish_reason is not None:
            child.finish_reason, child.stop_reason = o.finish_reason, o.stop_reason
            child.detok.flush()
        return False

    def _make_output(self, parent: _Parent, now: float, touched: set[int]) -> RequestOutput:
        outs = []
        finished = all(c.finish_reason is not None for c in parent.children)
        # Copying the whole lists into every step's output costs O(L) per step (O(L^2) per
        # request); delta outputs skip it until the last one.
        whole = finished or parent.output_kind == "cumulative"
        for c in parent.children:
            fin = c.finish_reason is not None
            delta_ids, delta_lp = (c.delta_ids, c.delta_logprobs) if id(c) in touched else ([], [])
            if c.logprobs is not None:
                c.logprobs.extend(delta_lp)
            lps = None if c.logprobs is None else (list(c.logprobs) if whole else [])
            outs.append(CompletionOutput(
                c.index, c.detok.text, list(c.output_token_ids) if whole else [],
                c.finish_reason.value if fin else None, c.stop_reason, lps,
                c.detok.take_delta(fin), delta_ids, delta_lp if c.logprobs is not None else None, c.error))
            if id(c) in touched:
                c.delta_ids, c.delta_logprobs = [], []
        metrics = self._metrics(parent, now if finished else None)
        if finished:
            del self._parents[parent.request_id]
            for c in parent.children:
                self._child_to_parent.pop(c.core_id, None)
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, outs, finished, metrics,
                             None if parent.prompt_logprobs is None else list(parent.prompt_logprobs))

    def _metrics(self, parent: _Parent, finish: float | None) -> RequestMetrics:
        kids = parent.children
        firsts = [c.first_token_time for c in kids if c.first_token_time is not None]
        scheds = [c.first_scheduled_time for c in kids if c.first_scheduled_time is not None]
        return RequestMetrics(
            parent.arrival_time, len(parent.prompt_token_ids),
            min(scheds) if scheds else None, min(firsts) if firsts else None, finish,
            sum(len(c.output_token_ids) for c in kids), max(0, max(c.prefix_hit_tokens for c in kids)),
            sum(c.num_preemptions for c in kids), sum(c.num_draft_tokens for c in kids),
            sum(c.num_accepted_tokens for c in kids))

    # ------------------------------------------------------------------ misc
    @property
    def child_pids(self) -> list[int]:
        """Processes this engine started: the engine core's (if any) and the workers'."""
        if self.core_mode == "process":
            return list(self.core.pids)
        return list(getattr(self.executor, "worker_pids", []))

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token for this model and dtype."""
        return self.core.kv_bytes_per_token

    def shutdown(self) -> None:
        """Abort what is left and write the step log if asked."""
        with self._lock:
            if self.dead is None:
                self.abort_request(list(self._parents))
            self.core.shutdown()
            self.step_log.close()


def _peek_config(source: ModelSource | None):
    from twinserve.backends.real.models.loader import peek_model_config

    if source is None:
        raise InvalidRequestError("no model source")
    return peek_model_config(source)
