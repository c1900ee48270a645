"""The disaggregated KV transfer: one decode GPU's bytes over one GPU's link (sim/cluster_study.kv_link)."""

from __future__ import annotations

import pytest

from tests.sim.helpers import small_config
from twinserve.backends.sim.catalog import get_hardware
from twinserve.sim.cluster_study import build_cluster


def _sim(model: str, hardware: str, tp: int, **fields):
    extra = {"quantization": "fp8"} if "DeepSeek" in model else {}
    cfg = small_config(model=model, hardware=hardware, tensor_parallel_size=tp, num_replicas=2,
                       num_prefill_replicas=1, num_requests=4, **extra, **fields)
    built = build_cluster(cfg)
    return built.simulation, built.engines[1].model


def test_mla_latent_moves_whole_to_each_decode_gpu_over_the_network_between_hgx_nodes() -> None:
    """DeepSeek-R1 (MLA) at TP 8 on H200: every rank holds the whole latent, so each decode GPU receives all
    of it; a TP-8 prefill and a TP-8 decode worker (16 GPUs) are two HGX nodes, so over the network."""
    sim, model = _sim("deepseek-ai/DeepSeek-R1", "H200", 8)
    hw = get_hardware("H200")
    assert model.is_mla
    assert sim.kv_bytes_per_token == model.kv_bytes_per_token
    assert sim.link_bandwidth == hw.internode_bandwidth
    want = sim.link_latency_s + 8192 * model.kv_bytes_per_token / hw.internode_bandwidth
    assert sim.transfer_seconds(8192) == pytest.approx(want, rel=1e-12)
    assert sim.transfer_seconds(8192) > 0.010  # 8k tokens of bf16 latent over 50 GB/s: ~11.5 ms


def test_workers_inside_one_nvlink_domain_transfer_over_nvlink() -> None:
    """GB200 (an NVL72 rack): a TP-4 prefill and a TP-4 decode worker share the NVLink domain."""
    sim, model = _sim("deepseek-ai/DeepSeek-R1", "GB200", 4)
    hw = get_hardware("GB200")
    assert sim.link_bandwidth == hw.interconnect_bandwidth
    assert sim.kv_bytes_per_token == model.kv_bytes_per_token


def test_gqa_heads_split_over_the_decode_ranks_and_the_knob_sets_one_gpus_link() -> None:
    """Llama-3.1-70B (8 KV heads) at TP 8: each decode GPU receives one head's K and V; [cluster]
    kv_link_bandwidth, when set, is one GPU's link."""
    sim, model = _sim("Llama-3.1-70B", "H200", 8)
    assert sim.kv_bytes_per_token == model.kv_bytes_per_token // 8 == model.kv_bytes_per_token_per_gpu(8)
    assert sim.link_bandwidth == get_hardware("H200").internode_bandwidth
    set_link, _ = _sim("Llama-3.1-70B", "H200", 8, kv_link_bandwidth=2e11)
    assert set_link.link_bandwidth == 2e11
