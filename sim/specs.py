"""A study's model and GPU: catalog names, config.json paths, or [model] / [hardware] tables.

    [engine]
    model = "configs/llama-3-70b/config.json"   # or an HF folder, or a catalog name
    hardware = "MyGPU"

    [hardware]                                  # SI units: FLOP/s, bytes/s, bytes, seconds
    name = "MyGPU"
    peak_flops = 989e12          # dense 16-bit
    peak_flops_fp8 = 1979e12     # dense FP8 (0 or left out: no FP8 tensor cores)
    mem_bandwidth = 3.35e12
    mem_gib = 80                 # or mem_bytes
    interconnect_bandwidth = 450e9   # per direction
    interconnect_latency_s = 35e-6   # one small all-reduce at TP 2
    host_link_bandwidth = 64e9       # to host memory, per direction (the host KV tier; PCIe Gen5 x16)
    host_link_latency_s = 10e-6      # fixed cost of one host transfer
    price_per_hour = 3.0
    base = "H100-SXM"            # kernel efficiencies and reserves taken from this catalog GPU

A [model] table takes config.json's keys (num_hidden_layers, hidden_size, ...) and a name.
Relative paths resolve against the study file's folder. Errors name file, line and key.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinserve.backends.sim.catalog import (GiB, GPUProfile, HardwareSpec, ModelSpec,
                                            UnknownSpecError, get_hardware, get_model)
from twinserve.backends.sim.aic_models import resolve_row_model
from twinserve.backends.sim.catalog import AIC_SYSTEMS
from twinserve.backends.sim.hf_config import ModelConfigError, load_hf_config, model_from_hf_dict

from twinserve.sim.config_lines import field_error, find_line
from twinserve.sim.errors import ConfigError

if TYPE_CHECKING:
    from twinserve.sim.config import StudyConfig

# [hardware] key -> (required, minimum is exclusive 0 (True) or inclusive 0 (False)).
_HW_NUMBERS = {"peak_flops": True, "mem_bandwidth": True, "interconnect_bandwidth": True,
               "peak_flops_fp8": False, "peak_flops_fp4": False, "interconnect_latency_s": False, "price_per_hour": False,
               "mem_gib": True, "mem_bytes": True, "host_link_bandwidth": True, "host_link_latency_s": False}
_HW_PROFILE = ("gemm", "attention", "memory", "comm", "allreduce_hop_s", "layer_floor_s")
_HW_KEYS = {"name", "base", *_HW_NUMBERS, *_HW_PROFILE}


def read_spec_tables(cfg: StudyConfig, data: dict[str, Any], text: str) -> None:
    """Parse [model] and [hardware] into cfg; [engine] names them unless it names others."""
    file = cfg.source
    engine_keys = data.get("engine", {}) if isinstance(data.get("engine"), dict) else {}
    for section in ("model", "hardware"):
        table = data.get(section)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table", file, find_line(text, None, section))
        if section == "model":
            cfg.custom_model = parse_model_table(table, file, text)
        else:
            cfg.custom_hardware = parse_hardware_table(table, file, text)
        if section not in engine_keys:
            setattr(cfg.engine, section, table.get("name", section))


def parse_model_table(table: dict[str, Any], file: str | None, text: str) -> ModelSpec:
    """A ModelSpec from a [model] table of config.json keys."""
    name = table.get("name", "model")
    if not isinstance(name, str) or not name:
        raise ConfigError("model.name", f"{name!r} is not a name", file, find_line(text, "model", "name"))
    keys = {k: v for k, v in table.items() if k != "name"}
    try:
        return model_from_hf_dict(keys, name, file, lambda k: find_line(text, "model", k))
    except ModelConfigError as e:
        raise ConfigError(f"model.{e.field}", e.args[1], file, e.line) from None


def parse_hardware_table(table: dict[str, Any], file: str | None, text: str) -> HardwareSpec:
    """A HardwareSpec from a [hardware] table (see the module docstring)."""
    def bad(key: str, msg: str) -> ConfigError:
        return ConfigError(f"hardware.{key}", msg, file, find_line(text, "hardware", key))

    for key in table:
        if key not in _HW_KEYS:
            raise bad(key, "no such field; known: " + ", ".join(sorted(_HW_KEYS)))
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise bad("name", "a [hardware] table needs a name (what [engine] hardware = names)")
    try:
        base = get_hardware(table["base"]).profile if "base" in table else GPUProfile()
    except UnknownSpecError as e:
        raise bad("base", str(e)) from None
    values: dict[str, float] = {}
    for key, positive in _HW_NUMBERS.items():
        if key not in table:
            continue
        v = table[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise bad(key, f"{v!r} is not a finite number")
        if positive and v <= 0:
            raise bad(key, f"{v!r} must be > 0")
        if v < 0:
            raise bad(key, f"{v!r} must be >= 0")
        values[key] = float(v)
    for key in ("peak_flops", "mem_bandwidth", "interconnect_bandwidth"):
        if key not in values:
            raise bad(key, "missing: a [hardware] table must give it")
    if "mem_gib" in values and "mem_bytes" in values:
        raise bad("mem_bytes", "give mem_gib or mem_bytes, not both")
    if "mem_gib" not in values and "mem_bytes" not in values:
        raise bad("mem_gib", "missing: a [hardware] table must give mem_gib (or mem_bytes)")
    mem = values.get("mem_bytes", values.get("mem_gib", 0.0) * GiB)
    profile = {k: table[k] for k in _HW_PROFILE if k in table}
    for k, v in profile.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or \
                (k in ("gemm", "attention", "memory", "comm") and not 0 < v <= 1):
            raise bad(k, f"{v!r} must be " + ("in (0, 1]" if k in ("gemm", "attention", "memory", "comm")
                                              else ">= 0"))
    if "interconnect_latency_s" in values:
        profile["allreduce_latency_s"] = values["interconnect_latency_s"]
    if "price_per_hour" in values:
        profile["price_per_hour"] = values["price_per_hour"]
    # The host link: the table's, else its base GPU's, else PCIe Gen5 x16.
    link = get_hardware(table["base"]) if "base" in table else None
    host = {k: values[k] if k in values else getattr(link, k) for k in ("host_link_bandwidth", "host_link_latency_s")
            if k in values or link is not None}
    return HardwareSpec(name.strip(), values["peak_flops"], values["mem_bandwidth"], mem,
                        values["interconnect_bandwidth"], dataclasses.replace(base, **profile),
                        peak_flops_fp8=values.get("peak_flops_fp8", 0.0),
                        peak_flops_fp4=values.get("peak_flops_fp4", 0.0), **host)


_error = field_error


def resolve_model(cfg: StudyConfig, name: str | None = None, setting: str = "engine.model") -> ModelSpec:
    """[engine] model (or name, read from `setting`): the [model] table's name, a catalog name, or a
    config.json / HF folder path."""
    name = cfg.engine.model if name is None else name
    custom = cfg.custom_model
    if custom is not None and name == custom.name:
        return custom
    try:
        return get_model(name)
    except UnknownSpecError as err:
        p = Path(name).expanduser()
        if not p.is_absolute() and cfg.source:
            p = Path(cfg.source).parent / p
        if "/" in name and not name.endswith(".json") and not p.exists():
            # An HF model id (deepseek-ai/DeepSeek-R1): aiconfigurator's shipped configs, else our catalog.
            try:
                return resolve_row_model(name)
            except UnknownSpecError as e:
                raise _error(cfg, setting, f"{e} (or a config.json path, an HF model folder, or a [model] "
                             "table)") from None
        if name.endswith(".json") or "/" in name or p.exists():
            try:
                return load_hf_config(p)
            except ModelConfigError as e:
                if e.field == "model":  # no file there: say which setting pointed at it
                    raise _error(cfg, setting, f"{p}: {e.args[1]}") from None
                raise
        raise _error(cfg, setting, f"{err} (or a config.json path, an HF model "
                     "folder, or a [model] table)") from None


# [speculative] draft_model naming the target's own multi-token-prediction module (ModelSpec.mtp_draft).
MTP_DRAFT = "mtp"


def resolve_draft_model(cfg: StudyConfig, target: ModelSpec) -> ModelSpec:
    """[speculative] draft_model, checked as the engine checks it: the target's vocabulary, no more weights.
    "mtp" is the target's own multi-token-prediction module (DeepSeek-V3/R1's NextN layer)."""
    if cfg.speculative.draft_model == MTP_DRAFT:
        try:
            return target.mtp_draft()
        except ValueError as err:
            raise _error(cfg, "speculative.draft_model", f"draft_model = \"{MTP_DRAFT}\": {err}") from None
    draft = resolve_model(cfg, cfg.speculative.draft_model, "speculative.draft_model")
    if draft.vocab_size != target.vocab_size:
        raise _error(cfg, "speculative.draft_model", f"{draft.name} has a vocabulary of {draft.vocab_size} tokens; "
                     f"a draft needs the target's ({target.vocab_size})")
    if draft.num_params > target.num_params:
        raise _error(cfg, "speculative.draft_model", f"{draft.name} ({draft.num_params:,} parameters) is larger "
                     f"than the target {target.name} ({target.num_params:,})")
    return draft.with_precision(target.precision)


def model_label(cfg: StudyConfig, name: str | None = None) -> str:
    """[engine] model (or name) for tables: the model's own name when given as a config path."""
    name = cfg.engine.model if name is None else name
    if not (name.endswith(".json") or "/" in name):
        return name
    try:
        engine = dataclasses.replace(cfg.engine, model=name)
        return resolve_model(dataclasses.replace(cfg, engine=engine)).name
    except (ConfigError, ModelConfigError):
        return name


def resolve_hardware(cfg: StudyConfig, name: str | None = None) -> HardwareSpec:
    """[engine] hardware (or name): the [hardware] table's GPU, else the catalog's."""
    name = cfg.engine.hardware if name is None else name
    custom = cfg.custom_hardware
    if custom is not None and name.lower() == custom.name.lower():
        return custom
    if name in AIC_SYSTEMS:  # aiconfigurator's system names (h200_sxm, gb200, ...)
        name = AIC_SYSTEMS[name]
    try:
        return get_hardware(name)
    except UnknownSpecError as err:
        raise _error(cfg, "engine.hardware", f"{err}, or define it in a [hardware] table") from None
