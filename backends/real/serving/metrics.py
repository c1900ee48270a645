"""Prometheus metrics under the `twinserve:` prefix (or `vllm:`), named as vLLM names its v1 metrics.

Names follow vLLM's production-metrics list (https://docs.vllm.ai/en/stable/usage/metrics/ and
vllm docs/design/metrics.md): gauges for scheduler state and KV usage (a 0..1 fraction despite
"perc"), counters in tokens for the prefix cache, histograms for request latencies. Counters
are exposed with prometheus_client's `_total` suffix, as vLLM's are. With `--metrics-prefix vllm`
the same series carry vLLM's own prefix, so its published Grafana dashboard
(vllm examples/observability/prometheus_grafana/grafana.json) finds every name it queries.
Older names that dashboards still query are kept beside the new ones: gpu_cache_usage_perc (the
same fraction as kv_cache_usage_perc) and time_per_output_token_seconds (observed per output
token, as vLLM v1 observes it). http_requests_total is named as prometheus-fastapi-instrumentator
names it in vLLM's server (no prefix; status grouped as 2xx, 4xx...).
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics,
                               generate_latest)

from twinserve.backends.real.outputs import RequestOutput
from twinserve.backends.real.serving.async_engine import EngineSnapshot

# The *_created series double the output and no dashboard reads them (vLLM turns them off too).
disable_created_metrics()

PREFIXES = ("twinserve", "vllm")
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
# Request lengths in tokens: 1-2-5 steps, as vLLM builds its token histograms.
_TOKEN_BUCKETS = tuple(float(m * 10 ** e) for e in range(6) for m in (1, 2, 5))
# Tokens per engine step: powers of two, as vLLM buckets iteration_tokens_total.
_ITERATION_BUCKETS = tuple(float(2 ** k) for k in range(15))
# n and max_tokens of a request: 1-2-5 steps.
_PARAM_BUCKETS = _TOKEN_BUCKETS
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                2.5, 5.0, 10.0, 20.0, 80.0)


class ServingMetrics:
    """One registry per server (tests run several in one process); fed from the engine thread."""

    def __init__(self, model_name: str, prefix: str = "twinserve") -> None:
        if prefix not in PREFIXES:
            raise ValueError(f"metrics prefix must be one of {PREFIXES}, got {prefix!r}")
        self.prefix = prefix + ":"
        self.registry = CollectorRegistry()
        r, labels, pre = self.registry, ["model_name"], self.prefix

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(pre + name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(pre + name, doc, labels, registry=r).labels(model_name)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(pre + name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("num_requests_running", "Requests holding KV blocks in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests queued, preempted ones included.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV blocks held by requests (0..1).")
        self.gpu_cache_usage = gauge("gpu_cache_usage_perc", "Older name of kv_cache_usage_perc (0..1).")
        self.free_blocks = gauge("kv_cache_free_blocks", "KV blocks not held by any request.")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.")
        # The host tier, under vLLM's names for a KV connector's external prefix cache (in tokens).
        self.external_queries = counter("external_prefix_cache_queries",
                                        "Prompt tokens looked up in the host-memory KV tier.")
        self.external_hits = counter("external_prefix_cache_hits", "Prompt tokens loaded from the host-memory KV tier.")
        # No vLLM name found for these: twinserve's own.
        self.offload_stored = counter("kv_offload_stored_bytes", "KV bytes copied from the device to the host tier.")
        self.offload_loaded = counter("kv_offload_loaded_bytes", "KV bytes copied from the host tier to the device.")
        self.preemptions = counter("num_preemptions", "Requests preempted (recomputed) since start.")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self._success = Counter(pre + "request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=r)
        self.ttft = hist("time_to_first_token_seconds", "Arrival to first token.", _LATENCY_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Gap between consecutive tokens of a request.",
                        _ITL_BUCKETS)
        self.tpot = hist("time_per_output_token_seconds", "Time per output token (each gap between tokens).",
                         _ITL_BUCKETS)
        self.iteration_tokens = hist("iteration_tokens_total", "Tokens scheduled per engine step.",
                                     _ITERATION_BUCKETS)
        self.params_n = hist("request_params_n", "The n of each request admitted.", _PARAM_BUCKETS)
        self.params_max_tokens = hist("request_params_max_tokens", "The max_tokens of each request admitted.",
                                      _PARAM_BUCKETS)
        self._http = Counter("http_requests", "HTTP requests by method, status class and route.",
                             ["method", "status", "handler"], registry=r)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Arrival to first scheduling.", _LATENCY_BUCKETS)
        self.prefill_time = hist("request_prefill_time_seconds", "First scheduling to first token.",
                                 _LATENCY_BUCKETS)
        self.decode_time = hist("request_decode_time_seconds", "First token to finish.", _LATENCY_BUCKETS)
        self.inference_time = hist("request_inference_time_seconds", "First scheduling to finish.",
                                   _LATENCY_BUCKETS)
        self.req_prompt_tokens = hist("request_prompt_tokens", "Prompt length of finished requests.",
                                      _TOKEN_BUCKETS)
        self.req_generation_tokens = hist("request_generation_tokens",
                                          "Tokens generated per finished request (all n sequences).",
                                          _TOKEN_BUCKETS)
        self.req_max_generation_tokens = hist("request_max_num_generation_tokens",
                                              "Longest of a finished request's n sequences, in tokens.",
                                              _TOKEN_BUCKETS)
        # Speculative decoding, as vLLM's spec_decode_* counters (per position: labelled by position).
        self.spec_drafts = counter("spec_decode_num_drafts", "Drafts verified (one per request per step).")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self._spec_per_pos = Counter(pre + "spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by position in the draft.",
                                     ["model_name", "position"], registry=r)
        self.model_name = model_name
        self._last: EngineSnapshot = EngineSnapshot()
        self._last_token: dict[str, float] = {}

    def on_iteration(self, snapshot: EngineSnapshot, outputs: list[RequestOutput], now: float) -> None:
        """Update gauges, add counter deltas, and observe latencies of finished requests."""
        last = self._last
        self.running.set(snapshot.num_running)
        self.waiting.set(snapshot.num_waiting)
        self.kv_usage.set(snapshot.kv_usage)
        self.gpu_cache_usage.set(snapshot.kv_usage)
        if snapshot.num_steps > last.num_steps and snapshot.step_tokens:
            self.iteration_tokens.observe(snapshot.step_tokens)
        self.free_blocks.set(snapshot.num_free_blocks)
        if snapshot.prefix_queries > last.prefix_queries:
            self.prefix_queries.inc(snapshot.prefix_queries - last.prefix_queries)
        if snapshot.prefix_hits > last.prefix_hits:
            self.prefix_hits.inc(snapshot.prefix_hits - last.prefix_hits)
        for name, metric in (("external_queries", self.external_queries), ("external_hits", self.external_hits),
                             ("offload_bytes_stored", self.offload_stored),
                             ("offload_bytes_loaded", self.offload_loaded)):
            delta = getattr(snapshot, name) - getattr(last, name)
            if delta > 0:
                metric.inc(delta)
        if snapshot.num_preemptions > last.num_preemptions:
            self.preemptions.inc(snapshot.num_preemptions - last.num_preemptions)
        if snapshot.spec_num_drafts > last.spec_num_drafts:
            self._observe_spec(snapshot, last)
        self._last = snapshot
        last_token = self._last_token
        for out in outputs:
            rid = out.request_id
            new = sum(len(c.token_ids_delta) for c in out.outputs)
            if new:
                self.generation_tokens.inc(new)
                prev = last_token.get(rid)
                if prev is not None:
                    self.itl.observe(now - prev)
                    self.tpot.observe(now - prev)
                last_token[rid] = now
            if out.finished:
                last_token.pop(rid, None)
                self._observe_finished(out)

    def _observe_spec(self, snapshot: EngineSnapshot, last: EngineSnapshot) -> None:
        self.spec_drafts.inc(snapshot.spec_num_drafts - last.spec_num_drafts)
        self.spec_draft_tokens.inc(snapshot.spec_num_draft_tokens - last.spec_num_draft_tokens)
        self.spec_accepted.inc(snapshot.spec_num_accepted_tokens - last.spec_num_accepted_tokens)
        before = last.spec_accepted_per_pos
        for pos, n in enumerate(snapshot.spec_accepted_per_pos):
            delta = n - (before[pos] if pos < len(before) else 0)
            if delta > 0:
                self._spec_per_pos.labels(self.model_name, str(pos)).inc(delta)

    def on_admitted(self, n: int, max_tokens: int | None) -> None:
        """Record a request's parameters when the engine takes it."""
        self.params_n.observe(n)
        if max_tokens is not None:
            self.params_max_tokens.observe(max_tokens)

    def on_http(self, method: str, handler: str, status: int) -> None:
        """Count one HTTP request."""
        self._http.labels(method, f"{status // 100}xx", handler).inc()

    def _observe_finished(self, out: RequestOutput) -> None:
        reason = out.outputs[0].finish_reason or "abort"
        self._success.labels(self.model_name, reason).inc()
        m = out.metrics
        if m is None:
            return
        self.prompt_tokens.inc(m.num_prompt_tokens)
        self.req_prompt_tokens.observe(m.num_prompt_tokens)
        self.req_generation_tokens.observe(sum(len(c.token_ids) for c in out.outputs))
        self.req_max_generation_tokens.observe(max((len(c.token_ids) for c in out.outputs), default=0))
        sched, first, fin = m.first_scheduled_time, m.first_token_time, m.finish_time
        prefill = first - sched if first is not None and sched is not None else None
        decode = fin - first if fin is not None and first is not None else None
        inference = fin - sched if fin is not None and sched is not None else None
        for hist, value in ((self.ttft, m.ttft), (self.e2e, m.e2e_latency), (self.queue, m.queue_time),
                            (self.prefill_time, prefill), (self.decode_time, decode),
                            (self.inference_time, inference)):
            if value is not None:
                hist.observe(value)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
