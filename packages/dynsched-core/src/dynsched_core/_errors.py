"""Typed errors raised by dynsched-core."""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigError",
    "ConfigTypeError",
    "DynschedError",
    "IllegalTransitionError",
    "NoRoutableReplicaError",
    "PluginError",
    "PolicyAPIError",
    "PolicyRegistryError",
    "RequestFailedError",
    "SampleWaitTimeoutError",
    "SwitchError",
    "UsageError",
]


class DynschedError(Exception):
    """Base class of every error raised by dynsched."""


class ConfigError(DynschedError, ValueError):
    """A configuration value is missing, of the wrong type or out of range.

    Attributes:
        key: The offending key (dotted path for nested config), if known.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.key))


class UsageError(DynschedError, ValueError):
    """A command-line argument or input file is wrong (the ``dynsched`` command's user error).

    ``dynsched`` prints it as one line, ``dynsched <sub-command>: error: <message>``, and
    exits with status 2. The message names the flag or file and what is allowed.
    """


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value has the wrong type (also a `TypeError`)."""


class PluginError(DynschedError, LookupError):
    """A plug-in name is unknown, provided by two distributions, or fails to load."""


class PolicyRegistryError(PluginError):
    """A policy name is unknown, registered twice, or points at a non-policy object."""


class PolicyAPIError(DynschedError, RuntimeError):
    """The installed dynsched-core provides a policy API a policy package cannot use."""


class IllegalTransitionError(DynschedError, RuntimeError):
    """A `HybridState` transition that the state machine does not allow."""

    def __init__(self, source: object, target: object) -> None:
        super().__init__(f"illegal hybrid state transition {source} -> {target}")
        self.source = source
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.target))


class SwitchError(DynschedError, RuntimeError):
    """An activation or deactivation step failed.

    The controller leaves the system in a safe state (hybrid replicas out of routing,
    state ``STANDALONE_ONLY``) before raising it.

    Attributes:
        operation: ``"activate"``, ``"deactivate"`` or ``"sync_weights"``.
        step: Name of the failed step (e.g. ``"wake_up"``, ``"remove_from_routing"``).
        replica_id: Replica whose call failed, when one is known.
    """

    def __init__(
        self,
        operation: str,
        step: str,
        replica_id: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        who = f" on replica {replica_id!r}" if replica_id is not None else ""
        why = f": {cause!r}" if cause is not None else ""
        super().__init__(f"{operation} failed at step {step!r}{who}{why}")
        self.operation = operation
        self.step = step
        self.replica_id = replica_id
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.operation, self.step, self.replica_id, self.cause))


class NoRoutableReplicaError(DynschedError, RuntimeError):
    """No replica is routable, so a request cannot be placed."""


class RequestFailedError(DynschedError, RuntimeError):
    """A generation request failed after all its retry attempts."""

    def __init__(self, request_id: str, attempts: int, cause: BaseException | None = None) -> None:
        super().__init__(f"request {request_id!r} failed after {attempts} attempt(s): {cause!r}")
        self.request_id = request_id
        self.attempts = attempts
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.request_id, self.attempts, self.cause))


class SampleWaitTimeoutError(DynschedError, TimeoutError):
    """Waiting for samples in the `SampleQueue` exceeded its timeout."""

    def __init__(self, wanted: int, available: int, timeout_s: float) -> None:
        super().__init__(
            f"timed out after {timeout_s:g} s waiting for {wanted} sample(s); {available} available"
        )
        self.wanted = wanted
        self.available = available
        self.timeout_s = timeout_s

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.wanted, self.available, self.timeout_s))
