"""`ReplicaLifecycle`: the serving state every replica shares, as one state machine.

A replica serves (``accepting``), is paused (awake, new requests refused), asleep (its
engine may have released memory) or closed. The `RolloutReplica` calls move it:

=========  ===========  ===========  ===========
event      accepting    paused       asleep
=========  ===========  ===========  ===========
pause      paused       paused       asleep
resume     accepting    accepting    refused (wake_up first)
sleep      asleep       asleep       asleep
wake_up    accepting    paused       paused
shutdown   closed       closed       closed
=========  ===========  ===========  ===========

A closed replica refuses every event but ``shutdown`` (`ReplicaDeadError`). A replica
class keeps only what is its own (engine handles, memory released by a GPU sleep, its
switch durations) and asks the lifecycle whether a call may run (`require_serving`,
`require_awake`). `InMemoryReplica` and the Ray runtime's engines (vLLM, HF) use it.

Example:
    >>> life = ReplicaLifecycle("r0", asleep=True)
    >>> life.apply("wake_up"), life.apply("resume")
    (<ReplicaPhase.PAUSED: 'paused'>, <ReplicaPhase.ACCEPTING: 'accepting'>)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from dynsched_core._errors import DynschedError

__all__ = [
    "TRANSITIONS",
    "ReplicaDeadError",
    "ReplicaLifecycle",
    "ReplicaNotReadyError",
    "ReplicaPhase",
    "check_replica_identity",
]

_ROLES = ("standalone", "hybrid")


class ReplicaDeadError(DynschedError, RuntimeError):
    """Raised by every call of a dead (killed or shut down) replica, running generations too."""


class ReplicaNotReadyError(DynschedError, RuntimeError):
    """A call the replica cannot serve in its current state (e.g. generate while asleep)."""


class ReplicaPhase(enum.Enum):
    """Where a replica's serving stands."""

    ACCEPTING = "accepting"
    PAUSED = "paused"
    ASLEEP = "asleep"
    CLOSED = "closed"


_A, _P, _S, _C = (
    ReplicaPhase.ACCEPTING,
    ReplicaPhase.PAUSED,
    ReplicaPhase.ASLEEP,
    ReplicaPhase.CLOSED,
)

#: event -> {phase it may leave: phase it enters}; a phase not listed refuses the event.
TRANSITIONS: Mapping[str, Mapping[ReplicaPhase, ReplicaPhase]] = {
    "pause": {_A: _P, _P: _P, _S: _S},
    "resume": {_A: _A, _P: _A},
    "sleep": {_A: _S, _P: _S, _S: _S},
    "wake_up": {_A: _A, _P: _P, _S: _P},
    "shutdown": {_A: _C, _P: _C, _S: _C, _C: _C},
}

#: What a refused call should be preceded by, per phase.
_FIRST = {_S: "wake_up", _P: "resume"}


def check_replica_identity(replica_id: object, role: object) -> None:
    """Refuse an empty or non-string ``replica_id`` and a role other than the two.

    Raises:
        ValueError: naming the argument and what it may be.
    """
    if not isinstance(replica_id, str) or not replica_id:
        raise ValueError(f"replica_id must be a non-empty string, got {replica_id!r}")
    if role not in _ROLES:
        raise ValueError(f"role must be one of {list(_ROLES)}, got {role!r}")


class ReplicaLifecycle:
    """The serving phase of one replica and its legal moves (`TRANSITIONS`).

    Args:
        replica_id: Named in refusals.
        asleep: Start asleep (a hybrid replica) rather than accepting.
    """

    def __init__(self, replica_id: str, *, asleep: bool) -> None:
        self.replica_id = replica_id
        self.phase = ReplicaPhase.ASLEEP if asleep else ReplicaPhase.ACCEPTING

    @property
    def asleep(self) -> bool:
        """True after ``sleep`` (or from the start) until ``wake_up``."""
        return self.phase is ReplicaPhase.ASLEEP

    @property
    def accepting(self) -> bool:
        """True when ``generate`` may run."""
        return self.phase is ReplicaPhase.ACCEPTING

    @property
    def closed(self) -> bool:
        """True after ``shutdown``."""
        return self.phase is ReplicaPhase.CLOSED

    def allows(self, event: str) -> bool:
        """Whether ``event`` (a key of `TRANSITIONS`) may run in this phase."""
        return self.phase in TRANSITIONS[event]

    def apply(self, event: str) -> ReplicaPhase:
        """Move by ``event`` (a key of `TRANSITIONS`); return the new phase.

        Raises:
            ReplicaNotReadyError: the event is refused in this phase (``resume`` asleep).
            ReplicaDeadError: the replica is closed.
            KeyError: not an event.
        """
        target = TRANSITIONS[event].get(self.phase)
        if target is None:
            raise self._refusal(event)
        self.phase = target
        return target

    def require(self, event: str) -> None:
        """Refuse ``event`` as `apply` would, without moving."""
        if not self.allows(event):
            raise self._refusal(event)

    def require_serving(self, what: str) -> None:
        """Refuse ``what`` (e.g. ``"generate('r1')"``) unless accepting."""
        if not self.accepting:
            raise self._refusal(what, "wake_up and resume" if self.asleep else None)

    def require_awake(self, what: str) -> None:
        """Refuse ``what`` (e.g. ``"update_weights(3)"``) while asleep or closed."""
        if self.phase in (ReplicaPhase.ASLEEP, ReplicaPhase.CLOSED):
            raise self._refusal(what)

    def _refusal(self, what: str, hint: str | None = None) -> Exception:
        if self.closed:
            return ReplicaDeadError(f"replica {self.replica_id!r} was shut down ({what} refused)")
        hint = hint or _FIRST.get(self.phase, "resume")
        return ReplicaNotReadyError(
            f"replica {self.replica_id!r} is {self.phase.value}: {what} refused ({hint} first)"
        )

    def __repr__(self) -> str:
        return f"ReplicaLifecycle({self.replica_id!r}, {self.phase.value})"
