"""The host-memory KV tier through the server: --kv-offloading-size, its counters under vLLM's names
in /metrics, the same tokens as without it, and a clear start-up error for a bad size."""

from __future__ import annotations

import httpx
import pytest

from twinserve.backends.real.procs import EngineStartupError
from twinserve.core.errors import InvalidConfigError

from .conftest import prometheus_series

# Token ids, so the lengths are exact: 40 tokens = 10 blocks of 4; the pool holds 14 blocks.
LONG = [5 + (7 * i) % 50 for i in range(40)]
OTHER = [[60 + (3 * i + k) % 40 for i in range(40)] for k in range(2)]


def _complete(server, prompt: list[int]) -> list[str]:
    r = server.client().completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0.0,
                                           logprobs=0, extra_body={"ignore_eos": True})
    return r.choices[0].logprobs.tokens


def _turns(server) -> list[list[str]]:
    # LONG, then two other prompts that take its blocks, then LONG again: the device lost it.
    return [_complete(server, p) for p in (LONG, *OTHER, LONG)]


def test_a_repeated_long_prompt_comes_back_from_the_host_tier(make_server) -> None:
    kw = dict(num_gpu_blocks_override=14, max_model_len=48, config_kw={"metrics_prefix": "vllm"})
    tier = make_server(kv_offloading_size=0.001, **kw)
    with_tier = _turns(tier)
    series = prometheus_series(httpx.get(tier.url + "/metrics").text)
    assert series["vllm:external_prefix_cache_hits_total"] >= 36  # 9 of LONG's 10 blocks
    assert series["vllm:external_prefix_cache_queries_total"] >= 4 * 40
    assert series["vllm:kv_offload_loaded_bytes_total"] > 0
    assert series["vllm:kv_offload_stored_bytes_total"] >= series["vllm:kv_offload_loaded_bytes_total"]
    plain = make_server(**kw)
    assert _turns(plain) == with_tier
    series = prometheus_series(httpx.get(plain.url + "/metrics").text)
    assert series.get("vllm:external_prefix_cache_hits_total", 0.0) == 0.0


@pytest.mark.parametrize("size", [-1.0, 1e-9])
def test_a_negative_size_or_a_tier_under_one_block_is_a_start_up_error(make_server, size) -> None:
    # In its own process the core reports the same error as a start-up failure.
    with pytest.raises((InvalidConfigError, EngineStartupError), match="kv_offloading_size"):
        make_server(kv_offloading_size=size, num_gpu_blocks_override=14)
