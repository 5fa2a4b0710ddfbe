"""dynsched-core: framework-free contracts and reference loop of dynsched.

Depends on the standard library and attrs only. The names below are the public API (see
the package README); the other names live in public submodules (`dynsched_core.events`,
`dynsched_core.errors`, `dynsched_core.trainer`, `dynsched_core.rollout`,
`dynsched_core.plugins`, `dynsched_core.derived`, `dynsched_core.validators`,
`dynsched_core.planner` (the run-time role planner),
`dynsched_core.testing`) or stay in private modules.
"""

from __future__ import annotations

# writing a policy
from dynsched_core._context import DynamicScheduleContext
from dynsched_core._contract import POLICY_API_VERSION, require_policy_api
from dynsched_core._policy import DynamicSchedulePolicyBase
from dynsched_core._registry import (
    available_policies,
    build_policy,
    get_policy_class,
    register_policy,
)

# configuration and guard rails
# isort: split
from dynsched_core._config import DynamicScheduleConfig
from dynsched_core._guards import GuardRailOverride, GuardRails

# embedding the scheduler: membership, switching, the policy call order
# isort: split
from dynsched_core._controller import ControllerOptions, DynamicResourceController
from dynsched_core._driver import DriverOptions, ScheduleDriver
from dynsched_core._replicas import ReplicaSet
from dynsched_core._state import HybridState

# the reference fully-async loop and its parts
# isort: split
from dynsched_core._client import ClientOptions, RetryingClient
from dynsched_core._inmemory import InMemoryReplica, InMemoryReplicaOptions
from dynsched_core._loop import FullyAsyncLoop, LoopResult, TrainerBackend
from dynsched_core._queue import AsyncSampleQueue
from dynsched_core._rollouter import Prompt, Rollouter, RollouterOptions, RolloutSample
from dynsched_core._routing import LoadBalancer

# protocols between the core and engines, routers, queues
# isort: split
from dynsched_core._protocols import (
    GenerateRequest,
    GenerateResult,
    ReplicaCapabilities,
    RolloutReplica,
    Router,
    SampleQueue,
)

# trainers (the rest, and the GPU hand-over: dynsched_core.trainer)
# isort: split

# events and errors (the rest: dynsched_core.events, dynsched_core.errors)
# isort: split
from dynsched_core._errors import ConfigError, DynschedError, SwitchError
from dynsched_core._events import EventBus

__version__ = "0.1.2"

__all__ = [
    "POLICY_API_VERSION",
    "AsyncSampleQueue",
    "ClientOptions",
    "ConfigError",
    "ControllerOptions",
    "DriverOptions",
    "DynamicResourceController",
    "DynamicScheduleConfig",
    "DynamicScheduleContext",
    "DynamicSchedulePolicyBase",
    "DynschedError",
    "EventBus",
    "FullyAsyncLoop",
    "GenerateRequest",
    "GenerateResult",
    "GuardRailOverride",
    "GuardRails",
    "HybridState",
    "InMemoryReplica",
    "InMemoryReplicaOptions",
    "LoadBalancer",
    "LoopResult",
    "Prompt",
    "ReplicaCapabilities",
    "ReplicaSet",
    "RetryingClient",
    "RolloutReplica",
    "RolloutSample",
    "Rollouter",
    "RollouterOptions",
    "Router",
    "SampleQueue",
    "ScheduleDriver",
    "SwitchError",
    "TrainerBackend",
    "available_policies",
    "build_policy",
    "get_policy_class",
    "register_policy",
    "require_policy_api",
]
