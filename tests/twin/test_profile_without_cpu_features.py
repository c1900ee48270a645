"""A CPU profile that recorded no CPU features (made before calibrate recorded them, like the shipped
bf16 SmolLM2 profile) cannot be told to match this host's kernels: it is refused as a mismatch would
be (--allow-profile-mismatch still runs it), and never suggested as shipped for this machine. It used
to pass on the CPU's model name alone, so a VM on a Xeon without AVX512-BF16/AMX was judged by prices
of oneDNN's bf16 kernels."""

from __future__ import annotations

import pytest

from twinserve.backends.sim.fitted import (FittedCostModel, ProfileError, builtin_profiles_for,
                                           check_profile_hardware)

XEON = "cpu: Intel(R) Xeon(R) Processor"
NO_AMX = {"capability": "AVX512", "flags": ["avx2", "fma", "avx512f"]}


def test_a_cpu_profile_without_cpu_features_is_refused_on_a_host_that_knows_its_own() -> None:
    bf16 = FittedCostModel.load("builtin:smollm2-135m-cpu-1t-bf16")
    assert bf16.meta["hardware"] == XEON and "cpu" not in bf16.meta["provenance"]
    xeon_cpu = FittedCostModel.load("builtin:smollm2-135m-cpu-1t-xeon").meta["provenance"]["cpu"]
    for cpu in (NO_AMX, xeon_cpu):
        with pytest.raises(ProfileError) as e:
            check_profile_hardware(bf16, XEON, cpu, source="profile p")
        msg = str(e.value)
        assert msg.startswith("profile p was calibrated on 'cpu: Intel(R) Xeon(R) Processor'"), msg
        assert "recorded no CPU features" in msg and "--allow-profile-mismatch" in msg, msg
        check_profile_hardware(bf16, XEON, cpu, allow_mismatch=True)  # the user's override
    check_profile_hardware(bf16, XEON, None)  # the engine's own features unknown: the name decides
    # Not offered as shipped for a host whose features are known: only the profile that recorded them.
    assert builtin_profiles_for(XEON, NO_AMX) == []
    assert builtin_profiles_for(XEON, xeon_cpu) == [("smollm2-135m-cpu-1t-xeon", "float32")]
    assert ("smollm2-135m-cpu-1t-bf16", "bfloat16") in builtin_profiles_for(XEON, None)
