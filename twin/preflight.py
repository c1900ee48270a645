"""Checks before any weights load: the profile fits this engine and machine, the workload is
servable, the flags make sense.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any

from twinserve.backends.sim.fitted import (FittedCostModel, ProfileError, builtin_profiles_for,
                                           check_profile_attention, check_profile_code_path, check_profile_core_mode,
                                           check_profile_hardware, check_profile_model, check_profile_numerics,
                                           check_profile_parallelism)
from twinserve.core.errors import TwinserveError

MAKE_PROFILE = "twinserve calibrate --out P.json"


class FidelityError(TwinserveError, ValueError):
    """A fidelity run cannot start as asked; the message says what to change."""


class NoFittingProfileError(ProfileError):
    """The profile was made for another engine or machine than this one."""


@dataclass(slots=True)
class EngineFacts:
    """What the engine will be, read from its flags and the model's config (no weights)."""

    model: str
    max_model_len: int
    vocab_size: int
    device: str
    dtype: str
    tensor_parallel_size: int
    core_mode: str
    small_batch_rows: int
    quantization: str | None
    hardware: str
    cpu: dict[str, Any] | None
    # The simulator's ModelSpec of the served model (spec_record), sliding window included.
    model_spec: dict[str, Any] | None = None
    # CPU fp32: the kernel of products above small_batch_rows rows (hardware.fp32_product_path).
    fp32_product_path: str | None = None
    # CPU: each row count's product path (product_paths.ProductPlan.record), None elsewhere.
    cpu_product_paths: dict[str, list[str]] | None = None

    @property
    def attention(self) -> dict[str, int]:
        """The profile's "attention" record for this model (fitted.ATTENTION_KEYS)."""
        m = self.model_spec or {}
        return {"sliding_window": int(m.get("sliding_window") or 0),
                "num_sliding_layers": int(m.get("num_sliding_layers") or 0),
                "num_layers": int(m.get("num_layers") or 0)}

    def describe(self) -> str:
        """One line: the engine and machine a profile must have been made for."""
        feats = ",".join((self.cpu or {}).get("flags") or [])
        return (f"{self.model} on {self.hardware}" + (f" [{feats}]" if feats else "")
                + f", {self.device} {self.dtype}, TP {self.tensor_parallel_size}, core {self.core_mode}")


def served_model_spec(cfg: Any, name: str, dtype_bytes: int = 2) -> Any:
    """The simulator's ModelSpec of a served model, from the engine's own reading of its config.

    The engine's reader (ModelConfig) is the one that decided which layers slide, so the window
    the cost model sees is the one the engine runs. Per-layer windows of several sizes are held
    as the largest (ModelSpec has one window).
    """
    from twinserve.backends.sim.catalog import ModelSpec

    windows = [w for w in cfg.layer_windows if w is not None]
    return ModelSpec(name, cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                     cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.max_position_embeddings,
                     tie_word_embeddings=bool(cfg.tie_word_embeddings), dtype_bytes=dtype_bytes,
                     sliding_window=max(windows) if windows else 0, num_sliding_layers=len(windows))


def engine_facts(args: Any) -> EngineFacts:
    """EngineFacts from EngineArgs: the model's config is peeked, nothing is built."""
    import dataclasses

    from twinserve.backends.real.engine import _peek_config
    from twinserve.backends.real.models.registry import resolve_model
    from twinserve.backends.real.hardware import cpu_features, device_name, fp32_product_path, product_plan
    from twinserve.backends.sim.catalog import catalog_name

    source = resolve_model(args.model)
    cfg = _peek_config(source)
    args.validate()
    device = args.resolve_device()
    dtype = args.resolve_dtype(device)
    spec = served_model_spec(cfg, source.name, dtype.itemsize)
    spec = dataclasses.replace(spec, name=catalog_name(spec))
    # Timed here on a cache miss (seconds), so the engine that starts next finds it cached.
    plan = product_plan(args, cfg)
    rows = plan.small_batch_rows() if plan is not None else args.resolve_small_batch_rows(device)
    return EngineFacts(spec.name, int(args.max_model_len or cfg.max_position_embeddings),
                       int(cfg.vocab_size), device.type, str(dtype).removeprefix("torch."),
                       int(args.tensor_parallel_size), args.resolve_engine_core_mode("inproc"),
                       rows, args.quantization, device_name(device),
                       cpu_features() if device.type == "cpu" else None, spec_record(spec), fp32_product_path(args, plan),
                       plan.record() if plan is not None else None)


def spec_record(spec: Any) -> dict[str, Any]:
    """A ModelSpec as forecast.json records it: its Precision (16-bit GPU types only) is left out,
    the engine's dtype is in the record beside it."""
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(spec).items() if k != "precision"}


def profile_made_for(profile: FittedCostModel) -> str:
    """One line: the engine and machine a profile was calibrated on."""
    prov = profile.meta.get("provenance") or {}
    feats = ",".join((prov.get("cpu") or {}).get("flags") or [])
    return (f"{profile.model or '?'} on {profile.meta.get('hardware') or '?'}" + (f" [{feats}]" if feats else "")
            + f", {prov.get('device', '?')} {prov.get('dtype', '?')}, TP {profile.meta.get('tensor_parallel_size')}"
            + f", core {prov.get('engine_core_mode', 'inproc')}")


def mismatches(profile: FittedCostModel, facts: EngineFacts, source: str = "profile") -> list[str]:
    """Each way the profile was made for another model, TP size, dtype, device, core mode or machine."""
    checks = (lambda: check_profile_model(profile, facts.model, source=source),
              lambda: check_profile_attention(profile, facts.attention, source=source),
              lambda: check_profile_parallelism(profile, facts.tensor_parallel_size, source=source),
              lambda: check_profile_numerics(profile, facts.device, facts.dtype, source=source,
                                             quantization=facts.quantization),
              lambda: check_profile_core_mode(profile, facts.core_mode, source=source),
              lambda: check_profile_code_path(profile, facts.small_batch_rows, source=source,
                                              product_path=facts.fp32_product_path,
                                              product_paths=facts.cpu_product_paths),
              lambda: check_profile_hardware(profile, facts.hardware, facts.cpu, source=source, suggest=False))
    out = []
    for check in checks:
        try:
            check()
        except ProfileError as e:
            out.append(str(e))
    return out


def check_profile(profile: FittedCostModel, facts: EngineFacts, source: str, allow_mismatch: bool = False) -> None:
    """Refuse a profile made for another engine or machine, naming both and the command to make one."""
    found = [] if allow_mismatch else mismatches(profile, facts, source)
    if found:
        # Only shipped profiles this engine would accept: never name a refused one as the one to use.
        shipped = [f"builtin:{n}" for n, _ in builtin_profiles_for(facts.hardware, facts.cpu)
                   if not mismatches(FittedCostModel.load(f"builtin:{n}"), facts, f"builtin:{n}")]
        raise NoFittingProfileError(
            "; ".join(found) + f"\n  profile: {profile_made_for(profile)}\n  engine:  {facts.describe()}\n"
            + (f"  shipped for this machine: {', '.join(shipped)}\n" if shipped
               else "  no shipped profile fits this machine\n")
            + f"  make one (~3 min on a quiet core): `{MAKE_PROFILE}`, or run `twinserve fidelity --calibrate`")


def check_flags(repeats: int, rate: float | None, num_requests: int, time_scale: float, trace_offset: int = 0) -> None:
    """Bad numbers are refused before anything loads."""
    if trace_offset < 0:
        raise FidelityError(f"--trace-offset {trace_offset}: give rows to skip, >= 0")
    if repeats < 1:
        raise FidelityError(f"--repeats {repeats}: give 1 or more (3 resolve most cells on a quiet machine)")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise FidelityError(f"--rate {rate}: give a finite number of requests per second > 0 (for all at once, "
                            "a trace's own timestamps or a large rate such as 1000)")
    if num_requests < 1:
        raise FidelityError(f"--num-requests {num_requests}: give 1 or more")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise FidelityError(f"--time-scale {time_scale}: give a factor > 0")
