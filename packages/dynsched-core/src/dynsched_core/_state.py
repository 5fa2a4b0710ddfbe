"""`HybridState` and the state machine of hybrid replicas."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

import attrs

from dynsched_core._clock import Clock, LoopClock
from dynsched_core._errors import IllegalTransitionError

__all__ = ["LEGAL_TRANSITIONS", "HybridState", "HybridStateMachine", "Transition"]

logger = logging.getLogger(__name__)


class HybridState(enum.Enum):
    """Where the hybrid replicas are in their lifecycle."""

    STANDALONE_ONLY = "standalone_only"
    """Hybrid replicas asleep, out of routing; trainer GPUs belong to training."""
    ACTIVATING = "activating"
    """Waking, syncing weights, resuming, adding to routing."""
    HYBRID_ACTIVE = "hybrid_active"
    """Hybrid replicas routable and generating next to the standalone ones."""
    DEACTIVATING = "deactivating"
    """Cutting routing, aborting in-flight requests, sleeping."""

    def __str__(self) -> str:
        return self.name


#: Allowed transitions. A failed activation falls back to ``STANDALONE_ONLY``; a failed
#: deactivation still ends in ``STANDALONE_ONLY`` (hybrid out of routing).
LEGAL_TRANSITIONS: frozenset[tuple[HybridState, HybridState]] = frozenset(
    {
        (HybridState.STANDALONE_ONLY, HybridState.ACTIVATING),
        (HybridState.ACTIVATING, HybridState.HYBRID_ACTIVE),
        (HybridState.ACTIVATING, HybridState.STANDALONE_ONLY),
        (HybridState.HYBRID_ACTIVE, HybridState.DEACTIVATING),
        (HybridState.DEACTIVATING, HybridState.STANDALONE_ONLY),
    }
)


@attrs.frozen
class Transition:
    """One state change, as delivered to listeners."""

    source: HybridState
    target: HybridState
    time: float
    reason: str = ""


Listener = Callable[[Transition], None]


class HybridStateMachine:
    """The single source of truth for the hybrid lifecycle state.

    Every transition is checked against `LEGAL_TRANSITIONS` and delivered to all
    listeners in registration order. A listener that raises is logged with its
    traceback and does not stop the transition or the other listeners (metrics and
    logging must never break a training run).
    """

    def __init__(
        self, clock: Clock | None = None, initial: HybridState = HybridState.STANDALONE_ONLY
    ) -> None:
        self._clock = clock or LoopClock()
        self._state = initial
        self._listeners: list[Listener] = []
        self.history: list[Transition] = []

    @property
    def state(self) -> HybridState:
        """The current state."""
        return self._state

    @property
    def is_hybrid_active(self) -> bool:
        """True only in ``HYBRID_ACTIVE``."""
        return self._state is HybridState.HYBRID_ACTIVE

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(transition)`` after every transition."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        self._listeners.remove(listener)

    def can_transition(self, target: HybridState) -> bool:
        """True when ``current -> target`` is legal."""
        return (self._state, target) in LEGAL_TRANSITIONS

    def transition(self, target: HybridState, reason: str = "") -> Transition:
        """Move to ``target``.

        Raises:
            IllegalTransitionError: the transition is not in `LEGAL_TRANSITIONS`.
        """
        if (self._state, target) not in LEGAL_TRANSITIONS:
            raise IllegalTransitionError(self._state, target)
        tr = Transition(self._state, target, self._clock.now(), reason)
        self._state = target
        self.history.append(tr)
        if len(self.history) > 10_000:
            del self.history[: len(self.history) - 10_000]
        for listener in list(self._listeners):
            try:
                listener(tr)
            except Exception:
                logger.exception(
                    "hybrid state listener %r failed on %s -> %s", listener, tr.source, tr.target
                )
        return tr
