"""The observations the core emits, for metrics, plots, logs and progress lines.

Producers (`Rollouter`, `DynamicResourceController`, `ScheduleDriver`, `ReplicaSet`,
`FullyAsyncLoop`, a host RL stack) emit on an `EventBus`; consumers (dynsched-metrics'
recorder, loggers, a runner's progress lines) subscribe. Events are small frozen value
objects stamped with the loop clock.
"""

from __future__ import annotations

from dynsched_core._events import (
    EventBus,
    FailoverEvent,
    GuardRailEvent,
    ReplicaModeEvent,
    RoleMoveEvent,
    RolloutEvent,
    SampleEvent,
    StalenessResetEvent,
    SwitchEvent,
    TrainStepEvent,
    TransitionEvent,
)
from dynsched_core._replicas import MembershipEvent

__all__ = [
    "EventBus",
    "FailoverEvent",
    "GuardRailEvent",
    "MembershipEvent",
    "ReplicaModeEvent",
    "RoleMoveEvent",
    "RolloutEvent",
    "SampleEvent",
    "StalenessResetEvent",
    "SwitchEvent",
    "TrainStepEvent",
    "TransitionEvent",
]
