"""dynsched-core: framework-free contracts and reference loop of dynsched.

Depends on the standard library and attrs only. See the package README for a tour.
"""

from __future__ import annotations

from dynsched_core._clock import Clock, LoopClock, ManualClock
from dynsched_core._context import DynamicScheduleContext
from dynsched_core._errors import (
    ConfigError,
    ConfigTypeError,
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
# isort: split
from dynsched_core._client import RetryingClient, RolloutOutcome
from dynsched_core._queue import AsyncSampleQueue
from dynsched_core._routing import LoadBalancer

# --- end runtime A ---

# --- runtime B: config, controller, rollouter, driver, reference loop (runtime-B work) ---
# isort: split
from dynsched_core._config import ConfigWarning, DynamicScheduleConfig
from dynsched_core._controller import DynamicResourceController, RebalanceReport
from dynsched_core._driver import AfterSyncResult, BeforeStepResult, ScheduleDriver
from dynsched_core._loop import (
    FullyAsyncLoop,
    LoopResult,
    StepRecord,
    TrainerBackend,
    run_fully_async,
)
from dynsched_core._rollouter import Prompt, Rollouter, RollouterStats, RolloutSample

# --- end runtime B ---

__version__ = "0.1.0"

__all__ = [
    "ENTRY_POINT_GROUP",
    "LEGAL_TRANSITIONS",
    "AfterSyncResult",
    "AsyncSampleQueue",
    "BeforeStepResult",
    "Clock",
    "ConfigError",
    "ConfigTypeError",
    "ConfigWarning",
    "DynamicResourceController",
    "DynamicScheduleConfig",
    "DynamicScheduleContext",
    "DynamicSchedulePolicyBase",
    "DynschedError",
    "EventBus",
    "FullyAsyncLoop",
    "GenerateRequest",
    "GenerateResult",
    "HybridState",
    "HybridStateMachine",
    "IllegalTransitionError",
    "LoadBalancer",
    "LoopClock",
    "LoopResult",
    "ManualClock",
    "NoRoutableReplicaError",
    "PolicyRegistryError",
    "Prompt",
    "QueueStats",
    "RebalanceReport",
    "ReplicaCapabilities",
    "ReplicaModeEvent",
    "RequestFailedError",
    "RetryingClient",
    "RolloutEvent",
    "RolloutOutcome",
    "RolloutReplica",
    "RolloutSample",
    "Rollouter",
    "RollouterStats",
    "Router",
    "SampleQueue",
    "SampleWaitTimeoutError",
    "ScheduleDriver",
    "StalenessResetEvent",
    "StepRecord",
    "SwitchError",
    "SwitchEvent",
    "TrainStepEvent",
    "TrainerBackend",
    "Transition",
    "TransitionEvent",
    "available_policies",
    "build_policy",
    "get_policy_class",
    "register_policy",
    "run_fully_async",
]
