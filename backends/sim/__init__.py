"""The simulated backend: a cost-model executor that runs the core's EngineCore unchanged."""

from twinserve.backends.sim.capacity import KVCapacity, kv_capacity
from twinserve.backends.sim.catalog import (HARDWARES, MODELS, HardwareSpec, ModelSpec, UnknownSpecError, get_hardware,
                      get_model)
from twinserve.backends.sim.cost_model import CostModel, Efficiency, RooflineCostModel, StepFeatures, WorkTotals
from twinserve.backends.sim.executor import SimExecutor
from twinserve.backends.sim.fit import fit_profile, fit_step_profile
from twinserve.backends.sim.fitted import FittedCostModel, ProfileError, check_profile_model
from twinserve.backends.sim import hf_config as _hf_config  # noqa: F401  (adds the shipped model files)

__all__ = [
    "CostModel", "Efficiency", "FittedCostModel", "HARDWARES", "HardwareSpec", "KVCapacity",
    "MODELS", "ModelSpec", "ProfileError", "RooflineCostModel", "SimExecutor", "StepFeatures",
    "UnknownSpecError", "WorkTotals", "check_profile_model", "fit_profile", "fit_step_profile", "get_hardware", "get_model", "kv_capacity",
]
