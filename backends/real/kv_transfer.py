"""vLLM's --kv-transfer-config, for the connector twinserve serves: the OffloadingConnector's CPU tier.

vLLM configures its host-memory KV tier either with --kv-offloading-size GiB or with the offloading
connector spelled out (docs.vllm.ai, "KV Offloading Usage Guide"): kv_connector "OffloadingConnector",
kv_role "kv_both", and kv_connector_extra_config {"cpu_bytes_to_use": N, "block_size": B,
"spec_name": "CPUOffloadingSpec"}. Here both become the same host tier (core/kv/host_tier.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinserve.core.errors import InvalidConfigError
from twinserve.core.knobs import json_object

_GIB = 1 << 30
_TOP = {"kv_connector", "kv_role", "kv_connector_extra_config"}
_EXTRA = {"cpu_bytes_to_use", "block_size", "spec_name"}


def parse_kv_transfer_config(spec: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """Check vLLM's dict (or its JSON text); unknown keys and other connectors are an error."""
    if spec is None:
        return None
    d = json_object("kv_transfer_config", spec)
    unknown = sorted(set(d) - _TOP)
    if unknown:
        raise InvalidConfigError("kv_transfer_config", unknown, f"keys among {sorted(_TOP)}")
    if d.get("kv_connector") != "OffloadingConnector":
        raise InvalidConfigError("kv_transfer_config.kv_connector", d.get("kv_connector"),
                                 "'OffloadingConnector' (the host-memory tier; other connectors move KV "
                                 "between engines, which twinserve does not serve)")
    if d.get("kv_role", "kv_both") != "kv_both":
        raise InvalidConfigError("kv_transfer_config.kv_role", d.get("kv_role"), "'kv_both' (an offloading tier "
                                 "both stores and loads)")
    extra = d.get("kv_connector_extra_config") or {}
    if not isinstance(extra, Mapping):
        raise InvalidConfigError("kv_transfer_config.kv_connector_extra_config", extra, "a JSON object / dict")
    unknown = sorted(set(extra) - _EXTRA)
    if unknown:
        raise InvalidConfigError("kv_transfer_config.kv_connector_extra_config", unknown,
                                 f"keys among {sorted(_EXTRA)} (size the tier in bytes: cpu_bytes_to_use)")
    if extra.get("spec_name", "CPUOffloadingSpec") != "CPUOffloadingSpec":
        raise InvalidConfigError("kv_transfer_config.kv_connector_extra_config.spec_name", extra.get("spec_name"),
                                 "'CPUOffloadingSpec' (one CPU tier)")
    size = extra.get("cpu_bytes_to_use")
    if isinstance(size, bool) or not isinstance(size, int | float) or size <= 0:
        raise InvalidConfigError("kv_transfer_config.kv_connector_extra_config.cpu_bytes_to_use", size,
                                 "a number of bytes > 0")
    block = extra.get("block_size")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise InvalidConfigError("kv_transfer_config.kv_connector_extra_config.block_size", block,
                                 "an integer >= 1 (the engine's block_size)")
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": dict(extra)}


def offloading_gib(cfg: Mapping[str, Any], block_size: int) -> float:
    """The tier's size in GiB; an offload block other than the engine's own is refused by name."""
    extra = cfg["kv_connector_extra_config"]
    block = extra.get("block_size")
    if block is not None and block != block_size:
        raise InvalidConfigError("kv_transfer_config.kv_connector_extra_config.block_size", block,
                                 f"the engine's block_size ({block_size}): the tier stores the device's own "
                                 "blocks, not groups of them")
    return float(extra["cpu_bytes_to_use"]) / _GIB
