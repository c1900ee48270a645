"""The simulated backend: a cost-model executor that runs the core's EngineCore unchanged."""

from .capacity import KVCapacity, kv_capacity
from .catalog import (HARDWARES, MODELS, HardwareSpec, ModelSpec, UnknownSpecError, get_hardware,
                      get_model)
from .cost_model import CostModel, Efficiency, RooflineCostModel, StepFeatures, WorkTotals
from .executor import SimExecutor
from .fit import fit_profile, fit_step_profile
from .fitted import FittedCostModel, ProfileError, check_profile_model

__all__ = [
    "CostModel", "Efficiency", "FittedCostModel", "HARDWARES", "HardwareSpec", "KVCapacity",
    "MODELS", "ModelSpec", "ProfileError", "RooflineCostModel", "SimExecutor", "StepFeatures",
    "UnknownSpecError", "WorkTotals", "check_profile_model", "fit_profile", "fit_step_profile", "get_hardware", "get_model", "kv_capacity",
]
