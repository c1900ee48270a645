"""The measured-kernel cost model: step prices from aiconfigurator-core's per-operation databases.

Optional: `pip install 'twinserve[aic]'`. Importing this package needs nothing; building an
AicCostModel imports the SDK and says how to install it when it is missing.
"""

from twinserve.backends.sim.aic.cost_model import AicCostModel
from twinserve.backends.sim.aic.mapping import BACKENDS, SYSTEMS, AicError

__all__ = ["AicCostModel", "AicError", "BACKENDS", "SYSTEMS"]
