"""A hand-edited profile whose provenance (or its CPU record) has the wrong shape is a ProfileError naming
the file and field when it is loaded, not a raw AttributeError / TypeError from the machine checks."""

from __future__ import annotations

import copy
import json

import pytest

from twinserve.backends.sim.fitted import PROFILES_DIR, FittedCostModel, ProfileError

BASE = json.loads((PROFILES_DIR / "smollm2-135m-cpu-1t.json").read_text())


@pytest.mark.parametrize("path, value, field", [
    (("provenance",), "x", "provenance"),
    (("provenance",), [1], "provenance"),
    (("provenance", "cpu"), "avx2", "provenance.cpu"),
    (("provenance", "cpu", "flags"), "avx2 fma", "provenance.cpu.flags"),
    (("provenance", "cpu", "flags"), 3, "provenance.cpu.flags"),
    (("provenance", "cpu", "flags"), ["avx2", 7], "provenance.cpu.flags"),
    (("provenance", "cpu", "capability"), 2, "provenance.cpu.capability"),
])
def test_a_profile_whose_provenance_has_the_wrong_shape_is_refused_naming_the_field(
        tmp_path, path: tuple[str, ...], value: object, field: str) -> None:
    data = copy.deepcopy(BASE)
    at = data
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    p = tmp_path / "p.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as e:
        FittedCostModel.load(p)
    assert str(e.value).startswith(f"{p}: field '{field}'"), str(e.value)
    # The shipped profile itself loads (the check refuses only the wrong shapes).
    assert FittedCostModel.load("builtin:smollm2-135m-cpu-1t").meta["provenance"]["cpu"] == BASE["provenance"]["cpu"]
