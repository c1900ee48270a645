"""Workloads: arrival processes, length distributions, shared prefixes and multi-turn chats.

Items come lazily in arrival order and token ids only when a request arrives, so a long trace
never sits in memory as tokens. Independent random streams come from one seed.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from twinserve.core.knobs import knob
from twinserve.sim.errors import ConfigError, TraceError
from twinserve.sim.traces import TIME_UNITS, LengthStats, fit_lengths, read_trace

ARRIVALS = ("poisson", "gamma", "fixed", "all_at_once", "trace")
LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal", "trace")


_GAP_CHUNK = 256  # inter-arrival gaps drawn per numpy call
# Fresh prompt tokens: the first _DISTINCT are the request's own, the rest shared (fresh_tokens).
_DISTINCT = 64
# Trace arrivals slower than this (requests/s, over the first _RATE_ROWS used) look like an
# arrived_at column in ms read as seconds: a serving trace is rarely under one request a minute.
_MIN_TRACE_RATE = 1.0 / 60.0
_RATE_ROWS = 1000
_TOKEN_CHUNK = 256  # requests whose own tokens are drawn per numpy call


# Token draws already made in this process (_drawn), by every Workload; oldest out (a draw dropped
# is drawn again, identically, when asked).
_DRAWS: dict[tuple, list] = {}
_DRAWS_KEPT = 32


def _drawn(seed: Any, stream: int, part: int | None, vocab_size: int, shape: Any) -> list:
    """np.random.default_rng([seed, stream(, part)]).integers(2, vocab_size, shape).tolist(), drawn
    once per process: every run of a search (one Workload each, the same seed and vocabulary) drew
    the same prompt tokens again (~1% of a search's CPU). Callers only copy out of it (fresh_tokens
    slices), never change it."""
    key = (seed, stream, part, vocab_size, shape)
    got = _DRAWS.get(key)
    if got is None:
        rng = np.random.default_rng([seed, stream] if part is None else [seed, stream, part])
        got = rng.integers(2, vocab_size, shape).tolist()
        if len(_DRAWS) >= _DRAWS_KEPT:
            del _DRAWS[next(iter(_DRAWS))]
        _DRAWS[key] = got
    return got


def range_bounds(length: float, ratio: float) -> tuple[int, int]:
    """[low, high] of a length L drawn with vllm bench serve's --random-range-ratio r.

    vllm/benchmarks/datasets/utils.py: low = floor(L(1-r)), high = ceil(L(1+r)), at least 1.
    """
    return max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))


@dataclass(slots=True)
class WorkloadConfig:
    """What requests arrive and when; every field has a default."""

    num_requests: int = knob(400, help="first-turn requests (conversations when multi-turn)", range=(1, None))
    arrival: str = knob("poisson", help="arrival process", choices=ARRIVALS)
    rate: float = knob(4.0, help="arrival rate (poisson, gamma, fixed)", unit="requests/s", range=(1e-4, 1e6))
    burstiness: float = knob(1.0, help="gamma shape: 1 = Poisson, < 1 burstier", range=(1e-3, 1e3))
    time_scale: float = knob(1.0, help="trace timestamps are multiplied by this", range=(1e-6, 1e4))
    trace: str = knob("", help="a trace CSV path, or builtin:azure_conv (the bundled excerpt)")
    # Unset, arrivals slower than one a minute are refused as a likely ms column (_check_trace_rate).
    trace_time_unit: str = knob("s", help="unit of a tokens trace's arrived_at column; set it to run a "
                                "trace slower than 1 request/min", choices=tuple(TIME_UNITS))
    trace_cycle: bool = knob(False, help="start the trace again when it runs out (timestamps shifted)")
    allow_short_trace: bool = knob(False, help="run on when the trace gives fewer than num_requests")
    prompt_dist: str = knob("lognormal", help="prompt length distribution", choices=LENGTH_DISTS)
    prompt_mean: float = knob(1024.0, help="mean prompt length", unit="tokens", range=(1, 1e9))
    prompt_std: float = knob(512.0, help="prompt length spread", unit="tokens", range=(0, 1e9))
    prompt_min: int = knob(16, help="shortest prompt", unit="tokens", range=(1, None))
    prompt_max: int = knob(4096, help="longest prompt", unit="tokens", range=(1, None))
    output_dist: str = knob("lognormal", help="output length distribution", choices=LENGTH_DISTS)
    output_mean: float = knob(200.0, help="mean output length", unit="tokens", range=(1, 1e9))
    output_std: float = knob(150.0, help="output length spread", unit="tokens", range=(0, 1e9))
    output_min: int = knob(1, help="shortest output", unit="tokens", range=(1, None))
    output_max: int = knob(1024, help="longest output", unit="tokens", range=(1, None))
    on_overlong: str = knob("clip",
                            help="a request with prompt + output > max_model_len is clipped, dropped or an error",
                            choices=("clip", "drop", "fail"))
    num_system_prompts: int = knob(0, help="shared prefixes", range=(0, 1_000_000), special={0: "none"})
    system_prompt_len: int = knob(0, help="tokens of each shared prefix (part of the prompt length)",
                                  unit="tokens", range=(0, None))
    system_prompt_zipf: float = knob(0.0,
                                     help="popularity of shared prefixes: weight of prefix i is 1/(i+1)^zipf",
                                     range=(0.0, None))
    turns: int = knob(1, help="turns per conversation; the next turn extends the context", range=(1, None))
    followup_tokens: int = knob(128, help="mean new user tokens in a follow-up turn", unit="tokens",
                                range=(1, None))
    think_time: float = knob(5.0, help="open loop: mean time between an answer and the next turn",
                             unit="seconds", range=(0.0, 1e5))
    vocab_size: int = knob(32000, help="prompt token ids are drawn below this (ids 0 and 1 are reserved)",
                           range=(3, None))
    # 'fixed' lengths drawn uniform in [floor(L(1-r)), ceil(L(1+r))], as vllm bench serve's
    # --random-range-ratio r (vllm/benchmarks/datasets/utils.py); 0 = exactly L.
    random_range_ratio: float = knob(0.0,
                                     help="fixed lengths drawn uniform in [L(1-r), L(1+r)], as vllm bench serve",
                                     range=(0.0, 1.0), open="hi")
    # Closed loop (sim/clients.py): N clients, each sending its next request think_time_s after
    # its last one's last token; 0 = open loop (arrival/rate). Warm-up requests are sent first and
    # left out of the metrics; num_requests are measured.
    concurrency: int = knob(0,
                            help="closed loop: clients, each sending its next request after its last one ends",
                            unit="clients", range=(0, 1_000_000), special={0: "open loop"})
    think_time_s: float = knob(0.0, help="closed loop: time between a client's requests", unit="seconds",
                               range=(0.0, 1e5))
    warmup_requests: int = knob(0, help="closed loop: first requests sent, left out of the metrics",
                                range=(0, 10_000_000))


@dataclass(slots=True)
class WorkItem:
    """One request of the workload, before it has token ids."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    index: int
    system_prompt: int = -1
    conversation: int = -1
    turn: int = 0
    # The previous turn's whole context (prompt + answer) for a follow-up turn.
    history: list[int] | None = field(default=None, repr=False)
    client: int = -1       # closed loop: the client that sends it
    warmup: bool = False   # closed loop: a warm-up request (left out of the metrics)


class Workload:
    """Produces WorkItems in arrival order and their token ids on demand."""

    def __init__(self, cfg: WorkloadConfig, seed: int = 0, max_model_len: int = 4096,
                 trace_path: str | None = None) -> None:
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.trace_path = trace_path or cfg.trace
        self.seed = seed
        # False (set when prefix caching is off) makes prompts cheap constant runs.
        self.distinct_tokens = True
        # True: a trace that runs out before num_requests is an error, not a smaller study.
        self.require_all = False
        # True: trace arrivals slower than _MIN_TRACE_RATE are refused (a study that set
        # trace_time_unit itself turns it off: sim/build.py).
        self.check_trace_rate = True
        self.unit_setting = "workload.trace_time_unit"  # named in that refusal (bench: its flag)
        self._item_line = 1  # the trace line of the last first-turn request made
        ss = np.random.SeedSequence(seed)
        a, l, p, _ = ss.spawn(4)  # the fourth stream is unused: token ids are keyed by request
        self._arr = np.random.default_rng(a)
        self._len = np.random.default_rng(l)
        self._pop = np.random.default_rng(p)
        self._shared_run: list[int] = []
        self.length_stats = LengthStats(cfg.on_overlong, max_model_len)
        self._system_prompts: dict[int, list[int]] = {}
        n = cfg.num_system_prompts
        if n > 0:
            w = np.array([1.0 / (i + 1) ** cfg.system_prompt_zipf for i in range(n)])
            self._pop_cum = np.cumsum(w / w.sum())
        self._index = 0

    # -------------------------------------------------------------- sampling
    def _draw_len(self, dist: str, mean: float, std: float, lo: int, hi: int,
                  rng: np.random.Generator | None = None) -> int:
        r = self._len if rng is None else rng
        if dist == "fixed":
            ratio = self.cfg.random_range_ratio
            if ratio > 0:
                # vllm bench serve's random dataset: integers in [floor(L(1-r)), ceil(L(1+r))].
                low, high = range_bounds(mean, ratio)
                v = r.integers(low, high + 1)  # config.validate keeps [low, high] in [lo, hi]
            else:
                v = mean
        elif dist == "uniform":
            v = r.integers(lo, hi + 1)
        elif dist == "normal":
            v = r.normal(mean, std)
        elif dist == "lognormal":
            sigma2 = math.log(1.0 + (std / mean) ** 2)
            v = r.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))
        else:
            raise ConfigError("workload.prompt_dist", f"unknown distribution {dist!r}")
        return int(min(max(round(float(v)), lo), hi))

    def _gaps(self) -> Iterator[float]:
        cfg = self.cfg
        r = self._arr
        # Chunked draws give the same floats as single draws, in fewer calls.
        if cfg.arrival == "poisson":
            while True:
                yield from r.exponential(1.0 / cfg.rate, _GAP_CHUNK).tolist()
        elif cfg.arrival == "gamma":
            shape = cfg.burstiness
            while True:
                yield from r.gamma(shape, 1.0 / (cfg.rate * shape), _GAP_CHUNK).tolist()
        elif cfg.arrival == "fixed":
            while True:
                yield 1.0 / cfg.rate
        else:  # all_at_once
            while True:
                yield 0.0

    def _rows(self) -> Iterator[tuple[float | None, int | None, int | None, str, int, str | None]]:
        """Trace rows (or endless blanks); a cycled trace ends each pass with a row whose file is ''."""
        cfg = self.cfg
        needs_trace = (cfg.arrival == "trace" or cfg.prompt_dist == "trace"
                       or cfg.output_dist == "trace")
        if needs_trace:
            if not self.trace_path:
                raise ConfigError("workload.trace", "a trace is needed for arrival/lengths "
                                  "'trace' but none is given")
            offset = 0.0
            cycle = 0
            while True:
                last = None
                lines = 1
                for row in read_trace(self.trace_path, time_unit=cfg.trace_time_unit):
                    lines = row.line
                    arrival = row.arrival_time
                    if arrival is not None:
                        last = arrival
                        arrival += offset
                    rid = row.request_id
                    if rid is not None and cycle:
                        rid = f"{rid}#{cycle}"  # ids stay unique over replays
                    yield arrival, row.num_prompt_tokens, row.num_output_tokens, \
                        self.trace_path, row.line, rid
                if not cfg.trace_cycle:
                    return
                yield None, None, None, "", lines, None
                cycle += 1
                # The next pass starts about one mean gap after this one ended.
                offset += (last or 0.0) * (1.0 + 1.0 / lines)
        else:
            while True:
                yield None, None, None, "<workload>", 0, None

    # -------------------------------------------------------------- items
    def items(self) -> Iterator[WorkItem]:
        """First-turn requests in arrival order (lazily)."""
        cfg = self.cfg
        closed = cfg.concurrency > 0  # clients set arrival times at run time (sim/clients.py)
        total = cfg.num_requests + (cfg.warmup_requests if closed else 0)
        if cfg.arrival == "trace" and not closed and self.check_trace_rate and self._stamped_arrived_at():
            self._check_trace_rate(total)
        yield from self._first_turns(total, closed)

    def _first_turns(self, total: int, closed: bool) -> Iterator[WorkItem]:
        cfg = self.cfg
        gaps = None if cfg.arrival == "trace" or closed else self._gaps()
        t = 0.0
        produced = 0
        at_pass_start = 0
        last_file, last_line = self.trace_path, 1
        for arrival, p_trace, o_trace, file, line, rid in self._rows():
            if produced >= total:
                return
            if not file:  # a cycled trace's pass ended: it must have given something
                if produced == at_pass_start:
                    raise TraceError(self.trace_path, line, None,
                                     f"no request of the trace fits max_model_len = "
                                     f"{self.max_model_len} (on_overlong = 'drop' drops "
                                     f"all {self.length_stats.dropped}); replaying it would never end")
                at_pass_start = produced
                continue
            last_file, last_line = file, line
            if closed:
                t = 0.0  # its client sends it when free (sim/clients.py)
            elif gaps is None:
                if arrival is None:
                    raise ConfigError("workload.arrival", f"'trace' needs timestamps, and "
                                      f"{file} has no TIMESTAMP or arrived_at column")
                t = arrival * cfg.time_scale
            elif produced:
                t = t + next(gaps)
            prompt = p_trace if cfg.prompt_dist == "trace" else self._draw_len(
                cfg.prompt_dist, cfg.prompt_mean, cfg.prompt_std, cfg.prompt_min, cfg.prompt_max)
            output = o_trace if cfg.output_dist == "trace" else self._draw_len(
                cfg.output_dist, cfg.output_mean, cfg.output_std, cfg.output_min, cfg.output_max)
            assert prompt is not None and output is not None
            fitted = fit_lengths(prompt, output, self.max_model_len, cfg.on_overlong,
                                 self.length_stats, file, line)
            if fitted is None:
                continue
            produced += 1
            self._item_line = line  # the rate check names the last row it judged
            item = self._make_item(t, fitted[0], fitted[1], conversation=produced - 1)
            if rid is not None and cfg.turns == 1:
                item.request_id = rid
            yield item
        short = total - produced
        if short > 0:
            self.length_stats.short = short
            if self.require_all:
                asked = " + warmup_requests" if total != cfg.num_requests else ""
                dropped = (f", {self.length_stats.dropped} dropped as over-long"
                           if self.length_stats.dropped else "")
                raise TraceError(last_file, last_line, None,
                                 f"the trace gives {produced} of the {total} requests asked "
                                 f"(workload.num_requests{asked}){dropped}; lower num_requests, "
                                 "set trace_cycle = true to replay it, or allow_short_trace = true "
                                 "to run with what it has")

    def _stamped_arrived_at(self) -> bool:
        """True when the trace is a tokens trace with an arrived_at column (a unit to mistake)."""
        if not self.trace_path:
            return False  # _rows names the missing trace
        try:
            with open(self.trace_path, newline="") as fh:
                return "arrived_at" in fh.readline()  # Azure TIMESTAMPs are clock times
        except (OSError, UnicodeDecodeError):
            return False  # read_trace names the file it cannot read

    def _check_trace_rate(self, total: int) -> None:
        """TraceError when the first requests the study runs arrive implausibly slowly (likely ms).

        Judged on a dry pass of a copy (its own random streams and counts), so the rows judged are the
        ones run, after over-long drops and a subclass's skipped rows, and the real pass is unchanged.
        """
        cfg = self.cfg
        probe = copy.copy(self)
        probe._arr, probe._len, probe._pop = (copy.deepcopy(g) for g in (self._arr, self._len, self._pop))
        probe.length_stats = LengthStats(cfg.on_overlong, self.max_model_len)
        probe.require_all = False  # a short trace is named by the real pass
        head = list(itertools.islice(probe._first_turns(total, False), min(total, _RATE_ROWS)))
        if len(head) < 2:
            return
        span = head[-1].arrival_time - head[0].arrival_time  # time_scale already applied
        rate = (len(head) - 1) / span if span > 0 else math.inf
        if rate >= _MIN_TRACE_RATE:
            return
        if span >= 86400:
            spans = f"{span / 86400:.1f} days"
        elif span >= 3600:
            spans = f"{span / 3600:.1f} hours"
        else:
            spans = f"{span / 60:.1f} minutes"
        scaled = f" after time_scale = {cfg.time_scale:g}" if cfg.time_scale != 1 else ""
        raise TraceError(self.trace_path, probe._item_line, "arrived_at",
                         f"the first {len(head)} requests the study runs span {spans}{scaled}, {rate:.2g} requests/s "
                         f"(one every {span / (len(head) - 1):,.0f} s), reading arrived_at in "
                         f"'{cfg.trace_time_unit}': is it in milliseconds? set {self.unit_setting} to "
                         f"'ms' (or 'us'), or to '{cfg.trace_time_unit}' to run it as read")

    def _make_item(self, t: float, prompt: int, output: int, conversation: int, turn: int = 0,
                   history: list[int] | None = None) -> WorkItem:
        idx = self._index
        self._index += 1
        sys_id = -1
        if self.cfg.num_system_prompts > 0 and turn == 0:
            sys_id = int(np.searchsorted(self._pop_cum, self._pop.random(), side="right"))
            sys_id = min(sys_id, self.cfg.num_system_prompts - 1)
        conv = conversation if self.cfg.turns > 1 else -1
        rid = f"c{conversation}-t{turn}" if conv >= 0 else f"r{idx}"
        return WorkItem(rid, t, prompt, output, idx, sys_id, conv, turn, history)

    def next_turn(self, item: WorkItem, context: list[int], finish_time: float) -> WorkItem | None:
        """The follow-up of a finished turn (its prompt extends context), or None when it ends."""
        cfg = self.cfg
        if item.turn + 1 >= cfg.turns:
            return None
        # The conversation's own stream: a turn must not depend on the order earlier turns finished.
        r = np.random.default_rng([self.seed, 11, item.conversation, item.turn])
        new = int(r.integers(max(1, cfg.followup_tokens // 2), cfg.followup_tokens * 3 // 2 + 1))
        if cfg.output_dist == "trace":  # the trace's length again (no random_range_ratio draw)
            output = min(max(item.num_output_tokens, cfg.output_min), cfg.output_max)
        else:
            output = self._draw_len(cfg.output_dist, cfg.output_mean, cfg.output_std,
                                    cfg.output_min, cfg.output_max, rng=r)
        think = float(r.exponential(cfg.think_time)) if cfg.think_time > 0 else 0.0
        prompt = len(context) + new
        if prompt + output > self.max_model_len:
            self.length_stats.followups_dropped += 1
            return None  # the conversation has outgrown the model
        self.length_stats.followups += 1
        return self._make_item(finish_time + think, prompt, output, item.conversation,
                               item.turn + 1, context)

    # -------------------------------------------------------------- tokens
    def system_prompt_tokens(self, sys_id: int) -> list[int]:
        """The shared prefix with this id (made once, from its own seeded stream)."""
        toks = self._system_prompts.get(sys_id)
        if toks is None:
            rng = np.random.default_rng([self.seed, 7, sys_id])
            toks = rng.integers(2, self.cfg.vocab_size, self.cfg.system_prompt_len).tolist()
            self._system_prompts[sys_id] = toks
        return toks

    def prompt_tokens(self, item: WorkItem) -> list[int]:
        """Token ids of the item's prompt: shared prefix or history, then fresh tokens."""
        n = item.num_prompt_tokens
        if item.history is not None:
            head = item.history
        elif item.system_prompt >= 0:
            head = self.system_prompt_tokens(item.system_prompt)[:max(0, n - 1)]
        else:
            head = []
        rest = n - len(head)
        if rest <= 0:
            return head[:n]
        if not self.distinct_tokens:
            # Token ids only matter to a prefix cache; without one, any ids will do.
            return head + [self.sample_token(item)] * rest
        fresh = self.fresh_tokens(item.index, rest)
        return head + fresh if head else fresh

    def fresh_tokens(self, index: int, n: int) -> list[int]:
        """n fresh token ids for the request with this index (the same whenever asked).

        The first _DISTINCT are the request's own draws, the rest a run shared by all: prefix-cache
        keys chain through earlier blocks, so the shared tail makes no prefix common, and it
        spares an int object per prompt token.
        """
        chunk, row = divmod(index, _TOKEN_CHUNK)
        own = _drawn(self.seed, 13, chunk, self.cfg.vocab_size, (_TOKEN_CHUNK, _DISTINCT))[row]
        if n <= _DISTINCT:
            return own[:n]
        run = self._shared_run
        if n > len(run):
            # Drawn whole each time it grows, so its ids do not depend on the lengths asked.
            size = max(n, self.max_model_len, 2 * len(run))
            run = self._shared_run = _drawn(self.seed, 17, None, self.cfg.vocab_size, size)
        toks = run[:n]
        toks[:_DISTINCT] = own  # one list, no concatenation
        return toks

    def sample_token(self, item: WorkItem) -> int:
        """The token id the simulated model emits for this request (never 0 or 1)."""
        return 2 + (item.index * 7919) % (self.cfg.vocab_size - 2)

    def expected_prefix_hits(self, item: WorkItem, block_size: int, cached: dict[int, int]) -> int:
        """Tokens of this first-turn item a prefix cache that never evicts must serve.

        cached: shared prompt id -> full blocks computed so far (updated with this item's).
        """
        if item.system_prompt < 0:
            return 0
        shared = min(self.cfg.system_prompt_len, item.num_prompt_tokens - 1)
        own = shared // block_size
        before = cached.get(item.system_prompt, 0)
        cached[item.system_prompt] = max(before, own)
        return min(before, own) * block_size
