"""Shared helpers for core tests: random workloads driven through the fake executor."""

from __future__ import annotations

from dataclasses import dataclass

from twinserve.core import EngineCore, Request, SamplingParams, SchedulerConfig
from twinserve.core.fake_executor import FakeExecutor
from twinserve.core.spec_decode import SpeculativeConfig


def assert_like_reference_and_freed(core: EngineCore, log: RunLog, cfg: SchedulerConfig, arrivals: list) -> None:
    """Every request's output is what it generates alone (reference_output), and every KV block came back."""
    ex = FakeExecutor(block_size=cfg.block_size)
    for a in arrivals:
        assert log.outputs[a.request.request_id] == reference_output(ex, a.request, cfg.max_model_len)
    kv = core.scheduler.kv
    assert kv.num_free_blocks == cfg.num_blocks and not kv.req_to_blocks


def reference_output(ex: FakeExecutor, req: Request, max_model_len: int) -> list[int]:
    """What the toy model generates for this request running alone, stop rules applied."""
    sp = req.sampling_params
    max_tokens = sp.max_tokens if sp.max_tokens is not None else max_model_len - req.num_prompt_tokens
    toks = list(req.prompt_token_ids)
    out: list[int] = []
    while True:
        t = ex.next_token(toks[-1], len(toks))
        toks.append(t)
        out.append(t)
        if len(out) > sp.min_tokens:  # min_tokens tokens come before any stop
            if (t == req.eos_token_id and not sp.ignore_eos) or t in sp.stop_token_ids:
                return out
        if len(out) >= max_tokens or len(toks) >= max_model_len:
            return out


@dataclass(slots=True)
class Arrival:
    """A request and the step at which it arrives."""

    step: int
    request: Request


@dataclass(slots=True)
class RunLog:
    """What a driven run saw: per-step outputs and the order of admissions."""

    steps: int
    admitted: list[str]
    outputs: dict[str, list[int]]


def drive(config: SchedulerConfig, arrivals: list[Arrival], aborts: dict[int, list[str]] | None = None,
          max_steps: int = 20_000, check=None, spec: SpeculativeConfig | None = None,
          draft_miss: int = 3, load_delay: int = 0) -> tuple[EngineCore, RunLog]:
    """Run arrivals through an EngineCore until everything ends.

    The executor models every KV slot, so a request attending to KV that is not its own
    prefix's (stale, foreign or never written) fails the run. With spec, the executor
    proposes spec.num_speculative_tokens drafts a step (see FakeExecutor.propose). Host-tier loads
    land load_delay steps after they are issued.
    """
    k = spec.num_speculative_tokens if spec is not None else 0
    ex = FakeExecutor(block_size=config.block_size, model_kv=True, num_speculative_tokens=k,
                      draft_miss=draft_miss, sliding_window=config.sliding_window or None,
                      kv_groups=config.kv_groups, load_delay=load_delay)
    core = EngineCore(config, ex, speculative_config=spec)
    pending = sorted(arrivals, key=lambda a: a.step)
    aborts = aborts or {}
    admitted: list[str] = []
    outputs: dict[str, list[int]] = {a.request.request_id: [] for a in arrivals}
    step = 0
    i = 0
    while i < len(pending) or core.has_unfinished_requests():
        while i < len(pending) and pending[i].step <= step:
            core.add_request(pending[i].request)
            i += 1
        if step in aborts:
            core.abort(aborts[step], now=float(step))
        sched = core.scheduler
        waiting_before = [r.request_id for r in sched.waiting]
        so = sched.schedule(float(step))
        if check is not None:
            check(core, so, waiting_before)
        admitted += [n.req_id for n in so.scheduled_new_reqs]
        mro = ex.execute(so)
        for out in sched.update_from_output(so, mro, float(step) + 0.5):
            outputs[out.req_id] += out.new_token_ids
        step += 1
        assert step < max_steps, f"run did not finish in {max_steps} steps"
    return core, RunLog(step, admitted, outputs)


def make_request(rid: str, prompt: list[int], max_tokens: int, **kw) -> Request:
    """A request with the given prompt and output cap."""
    eos = kw.pop("eos_token_id", None)
    priority = kw.pop("priority", 0)
    arrival_time = kw.pop("arrival_time", 0.0)
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, **kw), eos_token_id=eos,
                   priority=priority, arrival_time=arrival_time)


Streams = dict[str, tuple[list[int], object, str | None]]  # request id -> (tokens, finish reason, error)


def run_streams(core: EngineCore, limit: int, what: str, start: float = 0.0) -> tuple[Streams, int | None]:
    """Step core until nothing is left (at most limit steps): each request's streamed tokens, finish
    reason and error as a client would see them, and the step of the first error (None: none)."""
    from ..limits import bounded

    seen: Streams = {}
    failed_at = None
    for step in bounded(limit, what):
        if not core.has_unfinished_requests():
            break
        outs, _ = core.step(start + step)
        for o in outs:
            toks, _, _ = seen.get(o.req_id, ([], None, None))
            seen[o.req_id] = (toks + list(o.new_token_ids), o.finish_reason, o.error)
            if o.error is not None and failed_at is None:
                failed_at = step
    return seen, failed_at
