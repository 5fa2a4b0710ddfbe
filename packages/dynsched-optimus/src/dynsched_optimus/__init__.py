"""dynsched-optimus: Optimus-style cluster scheduling.

Convergence and speed models, greedy allocation by marginal gain per dominant share,
fewest-servers placement (Theorem 1), the parameter assignment algorithm (PAA) and, in
:mod:`dynsched_optimus.cluster`, a cluster simulator. The pure-Python test oracles
are not exported here: ``place_reference`` is in :mod:`dynsched_optimus.testing`,
``allocate_reference`` in the private module ``_allocation``.
"""

from __future__ import annotations

from dynsched_optimus._allocation import (
    RESOURCES,
    Allocation,
    AllocationJob,
    allocate,
    dominant_share,
)
from dynsched_optimus._convergence import (
    ConvergenceConfig,
    ConvergenceEstimator,
    ConvergenceFit,
    RemainingStepsInterval,
    detect_lr_decay,
    filter_outliers,
    fit_convergence,
    remaining_steps_interval,
)
from dynsched_optimus._errors import InsufficientDataError, OptimusError
from dynsched_optimus._io import InputFileError
from dynsched_optimus._models_zoo import MODEL_ZOO, ParameterBlock, model_blocks
from dynsched_optimus._paa import (
    PARAMETER_ASSIGNMENTS,
    ParameterAssignment,
    assign_mxnet_default,
    assign_paa,
    assign_paa_rules,
    assign_parameters,
    assign_round_robin,
)
from dynsched_optimus._placement import (
    STRATEGIES,
    JobPlacement,
    PlacementRequest,
    PlacementResult,
    even_split,
    place,
)
from dynsched_optimus._speed import (
    AllReduceSpeedModel,
    PSSpeedModel,
    StepTimeModel,
    fit_speed,
    placement_shape,
    plan_sampling,
)

__version__ = "0.1.0"

__all__ = [
    "MODEL_ZOO",
    "PARAMETER_ASSIGNMENTS",
    "RESOURCES",
    "STRATEGIES",
    "AllReduceSpeedModel",
    "Allocation",
    "AllocationJob",
    "ConvergenceConfig",
    "ConvergenceEstimator",
    "ConvergenceFit",
    "InputFileError",
    "InsufficientDataError",
    "JobPlacement",
    "OptimusError",
    "PSSpeedModel",
    "ParameterAssignment",
    "ParameterBlock",
    "PlacementRequest",
    "PlacementResult",
    "RemainingStepsInterval",
    "StepTimeModel",
    "__version__",
    "allocate",
    "assign_mxnet_default",
    "assign_paa",
    "assign_paa_rules",
    "assign_parameters",
    "assign_round_robin",
    "detect_lr_decay",
    "dominant_share",
    "even_split",
    "filter_outliers",
    "fit_convergence",
    "fit_speed",
    "model_blocks",
    "place",
    "placement_shape",
    "plan_sampling",
    "remaining_steps_interval",
]
