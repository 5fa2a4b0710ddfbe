"""`ReplicaLifecycle`: the serving state every engine replica shares, as one state machine.

A replica serves (``accepting``), is paused (awake, new requests refused), asleep (its
engine may have released memory) or closed. The core's `RolloutReplica` calls move it:

=========  ===========  ===========  ===========
event      accepting    paused       asleep
=========  ===========  ===========  ===========
pause      paused       paused       asleep
resume     accepting    accepting    refused (wake_up first)
sleep      asleep       asleep       asleep
wake_up    accepting    paused       paused
shutdown   closed       closed       closed
=========  ===========  ===========  ===========

A closed replica refuses every event but ``shutdown`` (`ReplicaDeadError`). An engine
keeps only what is its own (engine handles, memory released by a GPU sleep) and asks the
lifecycle whether a call may run (`require_serving`, `require_awake`).

Example:
    >>> life = ReplicaLifecycle("r0", asleep=True)
    >>> life.apply("wake_up"), life.apply("resume")
    (<Phase.PAUSED: 'paused'>, <Phase.ACCEPTING: 'accepting'>)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from dynsched_core.errors import ReplicaDeadError, ReplicaNotReadyError

__all__ = ["Phase", "ReplicaLifecycle"]


class Phase(enum.Enum):
    """Where a replica's serving stands."""

    ACCEPTING = "accepting"
    PAUSED = "paused"
    ASLEEP = "asleep"
    CLOSED = "closed"


_A, _P, _S, _C = Phase.ACCEPTING, Phase.PAUSED, Phase.ASLEEP, Phase.CLOSED

#: event -> {phase it may leave: phase it enters}; a phase not listed refuses the event.
TRANSITIONS: Mapping[str, Mapping[Phase, Phase]] = {
    "pause": {_A: _P, _P: _P, _S: _S},
    "resume": {_A: _A, _P: _A},
    "sleep": {_A: _S, _P: _S, _S: _S},
    "wake_up": {_A: _A, _P: _P, _S: _P},
    "shutdown": {_A: _C, _P: _C, _S: _C, _C: _C},
}

#: What a refused call should be preceded by, per phase.
_FIRST = {_S: "wake_up", _P: "resume"}


class ReplicaLifecycle:
    """The serving phase of one replica and its legal moves (`TRANSITIONS`).

    Args:
        replica_id: Named in refusals.
        asleep: Start asleep (a hybrid replica) rather than accepting.
    """

    def __init__(self, replica_id: str, *, asleep: bool) -> None:
        self.replica_id = replica_id
        self.phase = Phase.ASLEEP if asleep else Phase.ACCEPTING

    @property
    def asleep(self) -> bool:
        """True after ``sleep`` (or from the start) until ``wake_up``."""
        return self.phase is Phase.ASLEEP

    @property
    def accepting(self) -> bool:
        """True when ``generate`` may run."""
        return self.phase is Phase.ACCEPTING

    @property
    def closed(self) -> bool:
        """True after ``shutdown``."""
        return self.phase is Phase.CLOSED

    def apply(self, event: str) -> Phase:
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

    def require_serving(self, what: str) -> None:
        """Refuse ``what`` (e.g. ``"generate('r1')"``) unless accepting."""
        if not self.accepting:
            raise self._refusal(what, "wake_up and resume" if self.asleep else None)

    def require_awake(self, what: str) -> None:
        """Refuse ``what`` (e.g. ``"update_weights(3)"``) while asleep or closed."""
        if self.phase in (Phase.ASLEEP, Phase.CLOSED):
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
