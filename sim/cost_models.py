"""The step-time model a config names: ``cost.kind`` -> its class (:data:`COST_MODELS`).

``analytic``: the roofline of :mod:`sim.cost`; ``operator``: the per-operator model of
:mod:`sim.operator_cost`; ``calibrated``: that model with measured operator times
(:mod:`sim.calibrated_cost`).
"""

from __future__ import annotations

from .calibrated_cost import CalibratedOperatorModel
from .cost import AnalyticCostModel
from .errors import ConfigError
from .operator_cost import OperatorCostModel

#: ``cost.kind`` -> cost model class (each takes ``(model, gpu, cache, cost)`` config nodes)
COST_MODELS = {"analytic": AnalyticCostModel, "calibrated": CalibratedOperatorModel,
               "operator": OperatorCostModel}


def build_cost_model(model, gpu, cache, cost):
    """Return the cost model named by ``cost.kind``.

    Raises ConfigError for an unknown kind (valid: the keys of :data:`COST_MODELS`) or, for
    ``calibrated``, a missing / invalid calibration file.
    """
    if cost.kind not in COST_MODELS:
        raise ConfigError(f"cost.kind={cost.kind!r}; expected one of {sorted(COST_MODELS)}")
    return COST_MODELS[cost.kind](model, gpu, cache, cost)
