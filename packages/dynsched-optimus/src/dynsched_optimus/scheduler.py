"""The embeddable Optimus scheduler: observation records in, allocations and placements out.

See :mod:`dynsched_optimus._scheduler` for the strategies and their constants, and
:mod:`dynsched_optimus._observation` for the record a host fills in.
"""

from __future__ import annotations

from dynsched_optimus._observation import (
    COMPLETION_KINDS,
    CompletionRule,
    JobObservation,
    PrerunRequest,
)
from dynsched_optimus._scheduler import (
    CROSS_NODE_SLOWDOWN,
    DAMPING,
    HEDGE_CONFIDENCE,
    MAX_REMAINING_FACTOR,
    OPTIMUS_VARIANTS,
    PRIOR_SCALING_EXPONENT,
    SPEED_REFIT_ROUNDS,
    AllocationStrategy,
    Estimator,
    FewestServersPlacement,
    FittedEstimator,
    GreedyAllocation,
    IncrementalAllocation,
    NoPreruns,
    OptimusPolicy,
    OracleEstimator,
    PlacementStrategy,
    PrerunStrategy,
    RemainingEstimate,
    RestartPlanner,
    Round,
    SampledPreruns,
    ScheduleDecision,
    SpeedAwarePlacement,
    SpreadPlacement,
    Truth,
    make_optimus,
    workers_per_node,
)

__all__ = [
    "COMPLETION_KINDS",
    "CROSS_NODE_SLOWDOWN",
    "DAMPING",
    "HEDGE_CONFIDENCE",
    "MAX_REMAINING_FACTOR",
    "OPTIMUS_VARIANTS",
    "PRIOR_SCALING_EXPONENT",
    "SPEED_REFIT_ROUNDS",
    "AllocationStrategy",
    "CompletionRule",
    "Estimator",
    "FewestServersPlacement",
    "FittedEstimator",
    "GreedyAllocation",
    "IncrementalAllocation",
    "JobObservation",
    "NoPreruns",
    "OptimusPolicy",
    "OracleEstimator",
    "PlacementStrategy",
    "PrerunRequest",
    "PrerunStrategy",
    "RemainingEstimate",
    "RestartPlanner",
    "Round",
    "SampledPreruns",
    "ScheduleDecision",
    "SpeedAwarePlacement",
    "SpreadPlacement",
    "Truth",
    "make_optimus",
    "workers_per_node",
]
