"""dynsched-core: framework-free contracts and reference loop of dynsched.

Depends on the standard library and attrs only. See the package README for a tour.
"""

from __future__ import annotations

from dynsched_core._clock import Clock, LoopClock, ManualClock
from dynsched_core._context import DynamicScheduleContext
from dynsched_core._errors import (
    ConfigError,
    DynschedError,
    IllegalTransitionError,
    NoRoutableReplicaError,
    PolicyRegistryError,
    RequestFailedError,
    SampleWaitTimeoutError,
    SwitchError,
)
from dynsched_core._events import (
    EventBus,
    ReplicaModeEvent,
    RolloutEvent,
    StalenessResetEvent,
    SwitchEvent,
    TrainStepEvent,
    TransitionEvent,
)
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core._protocols import (
    GenerateRequest,
    GenerateResult,
    QueueStats,
    ReplicaCapabilities,
    RolloutReplica,
    Router,
    SampleQueue,
)
from dynsched_core._registry import (
    ENTRY_POINT_GROUP,
    available_policies,
    build_policy,
    get_policy_class,
    register_policy,
)
from dynsched_core._state import LEGAL_TRANSITIONS, HybridState, HybridStateMachine, Transition

# --- runtime A: routing, retrying client, queue (section owned by runtime-A work) ---
# --- end runtime A ---

# --- runtime B: config, controller, rollouter, driver, reference loop (runtime-B work) ---
# --- end runtime B ---

__version__ = "0.1.0"

__all__ = [
    "ENTRY_POINT_GROUP",
    "LEGAL_TRANSITIONS",
    "Clock",
    "ConfigError",
    "DynamicScheduleContext",
    "DynamicSchedulePolicyBase",
    "DynschedError",
    "EventBus",
    "GenerateRequest",
    "GenerateResult",
    "HybridState",
    "HybridStateMachine",
    "IllegalTransitionError",
    "LoopClock",
    "ManualClock",
    "NoRoutableReplicaError",
    "PolicyRegistryError",
    "QueueStats",
    "ReplicaCapabilities",
    "ReplicaModeEvent",
    "RequestFailedError",
    "RolloutEvent",
    "RolloutReplica",
    "Router",
    "SampleQueue",
    "SampleWaitTimeoutError",
    "StalenessResetEvent",
    "SwitchError",
    "SwitchEvent",
    "TrainStepEvent",
    "Transition",
    "TransitionEvent",
    "available_policies",
    "build_policy",
    "get_policy_class",
    "register_policy",
    # runtime A names are appended below by runtime-A work
    # runtime B names are appended below by runtime-B work
]
