"""Speculative decoding's Prometheus counters, under vLLM's names with --metrics-prefix vllm."""

from __future__ import annotations

import httpx

from twinserve.backends.real.serving.async_engine import EngineSnapshot
from twinserve.backends.real.serving.metrics import ServingMetrics

from .conftest import prometheus_series

PROMPT = "the quick brown fox jumps over the lazy dog " * 6
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def test_spec_counters_take_the_snapshots_deltas_by_position() -> None:
    m = ServingMetrics("tiny", "vllm")
    m.on_iteration(EngineSnapshot(spec_num_drafts=2, spec_num_draft_tokens=6, spec_num_accepted_tokens=3,
                                  spec_accepted_per_pos=(2, 1, 0)), [], 0.0)
    m.on_iteration(EngineSnapshot(spec_num_drafts=3, spec_num_draft_tokens=9, spec_num_accepted_tokens=6,
                                  spec_accepted_per_pos=(3, 2, 1)), [], 1.0)
    text = m.render().decode()
    series = prometheus_series(text)
    assert series["vllm:spec_decode_num_drafts_total"] == 3
    assert series["vllm:spec_decode_num_draft_tokens_total"] == 9
    assert series["vllm:spec_decode_num_accepted_tokens_total"] == 6
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="1"} 2.0' in text
    assert series["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == 6


def test_a_speculative_server_exports_the_counters_of_its_scheduler(make_server) -> None:
    s = make_server(config_kw={"metrics_prefix": "vllm"}, speculative_config=SPEC)
    r = s.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0.0,
                                      extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 12
    series = prometheus_series(httpx.get(s.url + "/metrics").text)
    drafted = series["vllm:spec_decode_num_draft_tokens_total"]
    accepted = series["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafted > 0 and series["vllm:spec_decode_num_drafts_total"] > 0
    assert 0 <= accepted <= drafted
    assert series.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", 0.0) == accepted
    stats = s.engine.core.stats()  # the scheduler's own totals, in whichever process it runs
    assert (stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens) == (drafted, accepted)
