"""vLLM's --kv-transfer-config with the OffloadingConnector: the host tier sized in bytes, bad configs named."""

from __future__ import annotations

import json

import pytest

from twinserve.backends.real.config import EngineArgs
from twinserve.core.errors import InvalidConfigError

GIB = 1 << 30


def _cfg(**extra):
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": GIB // 4, **extra}}


def test_the_offloading_connector_sizes_the_same_tier_as_kv_offloading_size() -> None:
    a = EngineArgs(model="m", kv_transfer_config=_cfg(block_size=16), block_size=16)
    assert a.kv_offloading_size == 0.25
    # As JSON text (the flag), and beside an equal --kv-offloading-size.
    b = EngineArgs(model="m", kv_transfer_config=json.dumps(_cfg()), kv_offloading_size=0.25)
    assert b.kv_offloading_size == 0.25 and b.kv_transfer_config["kv_connector"] == "OffloadingConnector"
    assert EngineArgs(model="m").kv_offloading_size == 0.0


@pytest.mark.parametrize("spec, field", [
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, "kv_transfer_config.kv_connector"),
    ({**_cfg(), "kv_role": "kv_producer"}, "kv_transfer_config.kv_role"),
    ({**_cfg(), "kv_buffer_size": 5}, "kv_transfer_config"),
    (_cfg(num_cpu_blocks=100), "kv_transfer_config.kv_connector_extra_config"),
    (_cfg(spec_name="TieringOffloadingSpec"), "kv_transfer_config.kv_connector_extra_config.spec_name"),
    (_cfg(cpu_bytes_to_use=0), "kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use"),
    (_cfg(cpu_bytes_to_use="1GB"), "kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use"),
    (_cfg(block_size=64), "kv_transfer_config.kv_connector_extra_config.block_size"),
    ("{not json", "kv_transfer_config"),
    ([1, 2], "kv_transfer_config"),
])
def test_a_config_the_tier_cannot_serve_is_a_start_up_error_naming_the_field(spec, field) -> None:
    with pytest.raises(InvalidConfigError) as e:
        EngineArgs(model="m", kv_transfer_config=spec, block_size=16)
    assert e.value.field == field


def test_a_size_that_disagrees_with_kv_offloading_size_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="kv_offloading_size .1.0 GiB"):
        EngineArgs(model="m", kv_transfer_config=_cfg(), kv_offloading_size=1.0)


def test_the_engine_builds_its_tier_from_the_connector(make_llm) -> None:
    by_size = make_llm(kv_offloading_size=1 / 64, enable_prefix_caching=True)
    by_connector = make_llm(kv_transfer_config=_cfg(cpu_bytes_to_use=GIB // 64), enable_prefix_caching=True)
    n = by_size.llm_engine.worker.num_host_blocks
    assert n > 0 and by_connector.llm_engine.worker.num_host_blocks == n


def test_an_eviction_policy_without_a_tier_is_refused_not_ignored() -> None:
    with pytest.raises(InvalidConfigError, match="kv_offloading_size") as e:
        EngineArgs(model="m", kv_offloading_policy="lrfu")
    assert e.value.field == "kv_offloading_policy"
    assert EngineArgs(model="m", kv_offloading_policy="lrfu", kv_offloading_size=1.0).kv_offloading_policy == "lrfu"
    assert EngineArgs(model="m", kv_offloading_policy="lrfu", kv_transfer_config=_cfg()).kv_offloading_size == 0.25


@pytest.mark.parametrize("size", [-1, "abc", float("nan")])
def test_llm_with_a_bad_tier_size_names_the_argument_before_loading(tiny_dir, size) -> None:
    from twinserve.backends.real import LLM
    from twinserve.core.knobs import KnobError

    with pytest.raises(KnobError, match=r"LLM\(kv_offloading_size=\.\.\.\).*kv_offloading_size"):
        LLM(str(tiny_dir), kv_offloading_size=size)


def test_a_connector_size_under_one_block_names_cpu_bytes_to_use(make_llm) -> None:
    # The tiny model's block of 4 tokens in float64: 2 layers x K and V x 2 heads x 16 x 8 bytes x 4 = 4,096 bytes.
    field = "kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use"
    with pytest.raises(InvalidConfigError, match="at least one KV block: 4096 bytes") as e:
        make_llm(kv_transfer_config={**_cfg(), "kv_connector_extra_config": {"cpu_bytes_to_use": 100}},
                 enable_prefix_caching=True)
    assert e.value.field == field and e.value.value == 100
