"""What check_profile_hardware tells a user whose profile was made on another machine: with
suggest=True (the default) the message names the shipped profiles for this machine, and each one
named exists and passes the same check here (a named profile that the check then refuses, or a
missing one, would send the user in a circle)."""

from __future__ import annotations

import re

import pytest

from twinserve.backends.sim.fitted import (FittedCostModel, ProfileError, builtin_profiles,
                                           check_profile_hardware)

AVX2 = {"capability": "AVX2", "flags": ["avx2", "fma"]}


def _machines() -> list[tuple[str, dict | None]]:
    """Each shipped profile's machine, plus ones nothing was shipped for."""
    out = []
    for name in builtin_profiles():
        meta = FittedCostModel.load(f"builtin:{name}").meta
        out.append((meta["hardware"], (meta.get("provenance") or {}).get("cpu")))
    xeon = next(h for h, cpu in out if cpu and "amx_tile" in cpu["flags"])
    # The Xeon's name without its AVX-512/AMX kernels; a GPU nothing was shipped for.
    return out + [(xeon, AVX2), ("NVIDIA H100 80GB HBM3", None)]


def _fits(profile: FittedCostModel, hardware: str, cpu: dict | None) -> bool:
    try:
        check_profile_hardware(profile, hardware, cpu)
    except ProfileError:
        return False
    return True


def _named(message: str) -> list[str] | None:
    """The builtin profiles a message suggests (None when it suggests none)."""
    m = re.search(r"\(or use (.*), shipped for it\)", message)
    if m is None:
        return None
    names = re.findall(r"builtin:([\w.-]+) \((\w+)\)", m.group(1))
    assert ", ".join(f"builtin:{n} ({d})" for n, d in names) == m.group(1), message  # nothing else in the list
    return [n for n, _ in names]


def test_the_suggested_profiles_exist_and_fit_this_machine() -> None:
    shipped = {n: FittedCostModel.load(f"builtin:{n}") for n in builtin_profiles()}
    refused = 0
    for hardware, cpu in _machines():
        fitting = sorted(n for n, p in shipped.items() if _fits(p, hardware, cpu))
        for name, profile in shipped.items():
            if name in fitting:
                continue
            with pytest.raises(ProfileError) as e:
                check_profile_hardware(profile, hardware, cpu, source=f"builtin:{name}")
            refused += 1
            message = str(e.value)
            assert message.startswith(f"builtin:{name} was calibrated on ") and repr(hardware) in message
            named = _named(message)
            # Exactly the shipped profiles the same check accepts here; never the refused one.
            assert sorted(named or []) == fitting, (hardware, cpu, message)
            assert name not in (named or [])
            for n in named or []:  # each exists under its name and carries the dtype shown
                loaded = FittedCostModel.load(f"builtin:{n}")
                assert f"builtin:{n} ({loaded.meta['provenance']['dtype']})" in message
            if not fitting:
                assert "(or use" not in message and "twinserve calibrate" in message
            # suggest=False: the caller names profiles itself; the message names none.
            with pytest.raises(ProfileError) as quiet:
                check_profile_hardware(profile, hardware, cpu, suggest=False)
            assert _named(str(quiet.value)) is None and "twinserve calibrate" in str(quiet.value)
    assert refused >= 6  # every machine refuses some shipped profile


def test_the_shipped_amd_profile_is_suggested_for_the_amd_machine() -> None:
    """The case a user of the project's VM meets: the Intel-made bf16 profile on the AMD host."""
    amd = FittedCostModel.load("builtin:smollm2-135m-cpu-1t")
    bf16 = FittedCostModel.load("builtin:smollm2-135m-cpu-1t-bf16")
    with pytest.raises(ProfileError) as e:
        check_profile_hardware(bf16, amd.meta["hardware"], amd.meta["provenance"]["cpu"], source="profile p")
    assert _named(str(e.value)) == ["smollm2-135m-cpu-1t"]
    assert "(or use builtin:smollm2-135m-cpu-1t (float32), shipped for it)" in str(e.value)
