"""Every error dynsched raises, all subclasses of `DynschedError`.

The most common (`DynschedError`, `ConfigError`, `SwitchError`) are also importable from
``dynsched_core``.
"""

from __future__ import annotations

from dynsched_core._errors import (
    ConfigError,
    ConfigTypeError,
    DynschedError,
    IllegalTransitionError,
    NoRoutableReplicaError,
    PluginError,
    PolicyAPIError,
    PolicyRegistryError,
    RequestFailedError,
    SampleWaitTimeoutError,
    SwitchError,
    UsageError,
)
from dynsched_core._handover import HandOverError
from dynsched_core._inmemory import ReplicaDeadError, ReplicaNotReadyError

__all__ = [
    "ConfigError",
    "ConfigTypeError",
    "DynschedError",
    "HandOverError",
    "IllegalTransitionError",
    "NoRoutableReplicaError",
    "PluginError",
    "PolicyAPIError",
    "PolicyRegistryError",
    "ReplicaDeadError",
    "ReplicaNotReadyError",
    "RequestFailedError",
    "SampleWaitTimeoutError",
    "SwitchError",
    "UsageError",
]
