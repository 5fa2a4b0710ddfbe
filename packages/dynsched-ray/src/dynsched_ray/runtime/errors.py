"""Typed errors raised by dynsched-ray."""

from __future__ import annotations

from typing import Any

from dynsched_core import ConfigError, DynschedError

__all__ = [
    "ActorUnavailableError",
    "AllReplicasLostError",
    "CheckpointWriteError",
    "EngineStartError",
    "ModelFilesError",
    "RemoteCallTimeoutError",
    "ReplicaActorDiedError",
    "TrainerOffloadedError",
]


class ActorUnavailableError(DynschedError, RuntimeError):
    """A Ray actor died, was killed, or cannot be reached.

    Attributes:
        what: The call that failed (``"<actor>.<method>"``).
        cause: The Ray exception, when there is one.
    """

    def __init__(self, what: str, cause: BaseException | None = None) -> None:
        why = f": {type(cause).__name__}" if cause is not None else ""
        super().__init__(f"actor call {what} failed, the actor is gone{why}")
        self.what = what
        self.cause = cause


class ReplicaActorDiedError(ActorUnavailableError):
    """The actor hosting a rollout replica died (the replica is out of the run).

    Attributes:
        replica_id: Id of the dead replica.
    """

    def __init__(self, replica_id: str, what: str, cause: BaseException | None = None) -> None:
        super().__init__(what, cause)
        self.replica_id = replica_id
        self.args = (f"replica {replica_id!r} is dead ({what})",)


class RemoteCallTimeoutError(DynschedError, TimeoutError):
    """A remote actor call did not answer within its timeout.

    Attributes:
        what: The call (``"<actor>.<method>"``).
        timeout_s: The timeout in seconds.
    """

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(f"actor call {what} did not answer within {timeout_s:g} s")
        self.what = what
        self.timeout_s = timeout_s


class AllReplicasLostError(DynschedError, RuntimeError):
    """Every rollout replica of the run is dead: the run cannot produce samples.

    Attributes:
        dead: Ids of the dead replicas.
    """

    def __init__(self, dead: list[str]) -> None:
        super().__init__(
            f"all rollout replicas are gone ({', '.join(sorted(dead)) or 'none were started'});"
            " the run cannot continue. Check the replica actors' logs (ray logs) for the cause."
        )
        self.dead = sorted(dead)


class CheckpointWriteError(DynschedError, RuntimeError):
    """A checkpoint (or metrics) write failed: the run stops, the last good one is kept.

    Attributes:
        step: The step whose write failed.
        last_step: Step of the last checkpoint on disk (None: none was written).
        folder: Where the last good checkpoint is.
    """

    def __init__(
        self,
        message: str,
        step: int = 0,
        last_step: int | None = None,
        folder: str = "",
    ) -> None:
        super().__init__(message)
        self.step = step
        self.last_step = last_step
        self.folder = folder

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.step, self.last_step, self.folder))


class TrainerOffloadedError(DynschedError, RuntimeError):
    """A call that needs a trainer's state on its device came while it was offloaded."""


class ModelFilesError(ConfigError):
    """A model folder given to an engine is missing or malformed (checked before start).

    Attributes:
        key: ``"model"`` (the offending argument).
        path: The folder (or file) that was given.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message, key="model")
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.path))


class EngineStartError(DynschedError, RuntimeError):
    """An inference engine did not come up (start-up timeout or an error while starting).

    Whatever the engine had started is shut down before this is raised.

    Attributes:
        replica_id: The replica whose engine failed to start.
        timed_out: True when the start-up timeout expired.
    """

    def __init__(self, message: str, replica_id: str = "", timed_out: bool = False) -> None:
        super().__init__(message)
        self.replica_id = replica_id
        self.timed_out = timed_out

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.replica_id, self.timed_out))
