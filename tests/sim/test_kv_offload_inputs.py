"""[kv_offload] and the host link on bad input: a clear error naming the field, exit 2 in a study;
the catalog's host links and the link's pricing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinserve.backends.sim.catalog import NVLINK_C2C, PCIE_GEN4_X16, PCIE_GEN5_X16, get_hardware
from twinserve.backends.sim.host_link import HostLink
from twinserve.core.errors import InvalidConfigError
from twinserve.sim import cli
from twinserve.sim.build import build
from twinserve.sim.config import load_config
from twinserve.sim.errors import ConfigError

from .helpers import small_config

STUDY = '[engine]\nmodel = "SmolLM2-135M"\nhardware = "H200"\n[workload]\nnum_requests = 5\nrate = 20.0\n'


def _study(tmp_path: Path, table: str, extra: str = "") -> Path:
    f = tmp_path / "s.toml"
    f.write_text(STUDY + extra + "[kv_offload]\n" + table)
    return f


@pytest.mark.parametrize("table, field, words", [
    ("host_size_gib = -1\n", "kv_offload.host_size_gib", "a number in (0"),
    ('host_size_gib = "lots"\n', "kv_offload.host_size_gib", "'lots' is not a number"),
    ("host_blocks = -3\n", "kv_offload.host_blocks", "an integer in [1"),
    ('eviction = "mru"\n', "kv_offload.eviction", "one of 'lru'"),
    ("host_size_gib = 4\nbandwidth = 0\n", "kv_offload.bandwidth", "bytes/s"),
    ("host_size_gib = 4\nlatency_s = -0.5\n", "kv_offload.latency_s", "seconds"),
    ("host_size_gib = 1\nhost_blocks = 100\n", "kv_offload.host_blocks", "give one of them"),
    # SmolLM2's 16-token block is 30 layers x 2 x 3 heads x 64 x 2 B x 16 = 360 KiB.
    ("host_size_gib = 0.0001\n", "kv_offload.host_size_gib", "smaller than one KV block"),
])
def test_bad_tier_settings_exit_2_naming_the_field(tmp_path: Path, capsys, table: str, field: str,
                                                   words: str) -> None:
    f = _study(tmp_path, table)
    rc = cli.main(["run", "--config", str(f), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    assert field in err and words in err, err
    assert f"{f}:" in err  # the file (and line) it came from


def test_a_tier_needs_prefix_caching(tmp_path: Path, capsys) -> None:
    f = _study(tmp_path, "host_size_gib = 2\n", "[scheduler]\nenable_prefix_caching = false\n")
    rc = cli.main(["run", "--config", str(f), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "kv_offload.host_size_gib" in err and "enable_prefix_caching" in err


def test_hardware_table_host_link_zero_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[engine]\nhardware = "MyGPU"\n[hardware]\nname = "MyGPU"\npeak_flops = 1e15\n'
                 'mem_bandwidth = 3e12\ninterconnect_bandwidth = 4e11\nmem_gib = 80\nhost_link_bandwidth = 0\n')
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert e.value.field == "hardware.host_link_bandwidth" and e.value.line == 9


def test_hardware_table_link_from_its_base_or_its_own(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    base = ('[engine]\nhardware = "MyGPU"\n[hardware]\nname = "MyGPU"\npeak_flops = 1e15\n'
            'mem_bandwidth = 3e12\ninterconnect_bandwidth = 4e11\nmem_gib = 80\n')
    f.write_text(base + 'base = "GB200"\n')
    assert load_config(f).custom_hardware.host_link_bandwidth == NVLINK_C2C
    f.write_text(base + 'base = "GB200"\nhost_link_bandwidth = 25e9\nhost_link_latency_s = 2e-5\n')
    hw = load_config(f).custom_hardware
    assert (hw.host_link_bandwidth, hw.host_link_latency_s) == (25e9, 2e-5)


def test_catalog_host_links() -> None:
    assert get_hardware("A100-80GB").host_link_bandwidth == PCIE_GEN4_X16
    assert get_hardware("H100-SXM").host_link_bandwidth == PCIE_GEN5_X16
    for name in ("GH200", "GB200", "GB300"):
        assert get_hardware(name).host_link_bandwidth == NVLINK_C2C


def test_tier_size_in_blocks_and_link_from_the_catalog() -> None:
    built = build(small_config(**{"kv_offload.host_size_gib": 1.0}))
    block = 16 * 32 * 2 * 32 * 128 * 2  # Llama-2-7B: 16 tokens x 32 layers x K,V x 32 heads x 128 x 2 B
    link = built.simulation.core.executor.link
    assert link.block_bytes == block and link.bandwidth == PCIE_GEN4_X16  # A100
    assert built.simulation.core.scheduler.kv.host.num_blocks == 2 ** 30 // block
    # TP 2: half a block on each GPU, copied over each GPU's own link; the tier holds as many blocks.
    built = build(small_config(**{"kv_offload.host_size_gib": 1.0, "kv_offload.bandwidth": 1e10,
                                  "tensor_parallel_size": 2}))
    link = built.simulation.core.executor.link
    assert link.bandwidth == 1e10 and link.block_bytes == block / 2
    assert built.simulation.core.scheduler.kv.host.num_blocks == 2 ** 30 // block
    built = build(small_config(**{"kv_offload.host_blocks": 77, "kv_offload.eviction": "lrfu"}))
    host = built.simulation.core.scheduler.kv.host
    assert (host.num_blocks, host.policy_name) == (77, "lrfu")


def test_link_rejects_zero_bandwidth() -> None:
    with pytest.raises(InvalidConfigError, match="bandwidth"):
        HostLink(0.0, 1e-5, 1024)


@given(st.lists(st.tuples(st.integers(1, 64), st.floats(0.0, 1.0)), min_size=1, max_size=30),
       st.floats(1e9, 1e12), st.floats(0.0, 1e-4))
def test_link_streams_are_fifo_and_priced(transfers, bandwidth, latency) -> None:
    link = HostLink(bandwidth, latency, 2.0 ** 20)
    now = last_load = last_store = 0.0
    for blocks, gap in transfers:
        now += gap
        d = link.transfer_time(blocks)
        assert d == pytest.approx(latency + blocks * 2.0 ** 20 / bandwidth)
        done = link.load(blocks, now)
        # Never before it could run, never before the one queued ahead of it.
        assert done >= now + d - 1e-12 and done >= last_load + d - 1e-12
        assert done == pytest.approx(max(now, last_load) + d)
        last_load = done
        s = link.store(blocks, now)
        assert s == pytest.approx(max(now, last_store) + d)  # the other direction: its own stream
        last_store = s
    assert link.loads.blocks == link.stores.blocks == sum(b for b, _ in transfers)


@pytest.mark.parametrize("table, named", [
    ('eviction = "lrfu"\n', "eviction = 'lrfu'"),
    ("bandwidth = 1e9\nlatency_s = 0.001\n", "bandwidth = 1000000000.0, latency_s = 0.001"),
])
def test_tier_settings_without_a_size_are_reported_unused_not_dropped_silently(tmp_path: Path, capsys, table: str,
                                                                               named: str) -> None:
    f = _study(tmp_path, table)
    assert cli.main(["run", "--config", str(f), "--out", str(tmp_path / "out")]) == 0
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert f"host KV tier: off (host_size_gib and host_blocks are 0), so [kv_offload] {named} went unused" in summary
    # With a size the settings are used, and a sweep over the size has its own tier per point: no note.
    f = _study(tmp_path, table + "host_size_gib = 1\n")
    assert cli.main(["run", "--config", str(f), "--out", str(tmp_path / "sized")]) == 0
    assert "went unused" not in (tmp_path / "sized" / "summary.md").read_text()
    f = _study(tmp_path, table)
    assert cli.main(["sweep", "--config", str(f), "--grid", "host_size_gib=0,1", "--workers", "1",
                     "--out", str(tmp_path / "swept")]) == 0
    assert "went unused" not in (tmp_path / "swept" / "summary.md").read_text()
