"""Observations emitted by the reference loop, for metrics, plots and logs.

Producers (`Rollouter`, `DynamicResourceController`, `ScheduleDriver`, a host RL stack)
call `EventBus.emit`; consumers (dynsched-metrics' recorder, loggers) subscribe. Events
are small frozen value objects; timestamps come from the loop clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from dynsched_core.planner import RoleSplit

__all__ = [
    "Event",
    "EventBus",
    "FailoverEvent",
    "GroupMode",
    "GuardRailEvent",
    "ReplicaModeEvent",
    "RoleMoveEvent",
    "RolloutEvent",
    "RolloutEventKind",
    "SampleEvent",
    "SampleEventKind",
    "StalenessResetEvent",
    "SwitchEvent",
    "TrainStepEvent",
    "TransitionEvent",
]

logger = logging.getLogger(__name__)

RolloutEventKind = Literal["seed", "submit", "complete", "drain", "capacity", "reset"]
GroupMode = Literal["rollout", "train", "weight_sync", "switching", "idle"]
SampleEventKind = Literal["produced", "consumed", "left"]


@attrs.frozen
class RolloutEvent:
    """A point of the rollouter's ``(t, active_tasks, capacity)`` history.

    Recorded when a sample is submitted, completes, is drained, and whenever the
    capacity changes. ``capacity = min(servers * concurrent_samples_per_replica,
    max_required_samples)``. The ``seed`` point may carry capacity 0 (placeholder)
    before the capacity is known.
    """

    time: float
    active: int
    capacity: int
    kind: RolloutEventKind


@attrs.frozen
class StalenessResetEvent:
    """The rollouter moved to a new parameter version (closes a rollout window)."""

    time: float
    param_version: int
    step_generated_samples: int


@attrs.frozen
class SampleEvent:
    """Sample ids crossing the queue (optional: for per-id accounting, e.g. a soak).

    ``produced``: the rollouter's ``put`` of these samples was acknowledged (emitted by
    `Rollouter`); ``consumed``: the trainer took them from the queue for micro-step
    ``step`` (emitted by `FullyAsyncLoop`); ``left``: what the queue still held when the
    loop ended (emitted by `FullyAsyncLoop` when its queue can list its contents, see
    ``AsyncSampleQueue.held_sample_ids``).

    Attributes:
        time: Loop time.
        kind: ``produced``, ``consumed`` or ``left``.
        sample_ids: The samples' ``sample_id`` as strings.
        step: The loop's micro-step (``consumed`` only; 1-based, per loop run).
    """

    time: float
    kind: SampleEventKind
    sample_ids: tuple[str, ...]
    step: int | None = None


def sample_key(sample: Any) -> str:
    """A sample's id as carried by `SampleEvent` (``str(sample_id)``, else ``repr``)."""
    sid = getattr(sample, "sample_id", None)
    return repr(sample) if sid is None else str(sid)


@attrs.frozen
class TrainStepEvent:
    """One trainer micro-step, as reported by the host stack or the reference trainer.

    Attributes:
        step: Global micro-step index (1-based).
        time: Loop time at the end of the step.
        timings: Seconds per phase, verl's ``timing_raw`` keys (``reward``,
            ``old_log_prob``, ``ref``, ``values``, ``adv``, ``update_critic``,
            ``update_actor``, ``wait_for_enough_samples``, ``step``, ``param_sync``, ...).
        allocated_s: Wall time from collecting samples through weight update and
            data dump (waits, param sync, activation included).
        mq_size: Queue size right after the step.
        is_sync_step: True when this micro-step ended with a weight sync (closes a cycle).
        hybrid_did_rollout: True when hybrid replicas generated during this step's wait.
    """

    step: int
    time: float
    timings: Mapping[str, float]
    allocated_s: float
    mq_size: int
    is_sync_step: bool
    hybrid_did_rollout: bool = False


@attrs.frozen
class SwitchEvent:
    """An activation or deactivation finished (successfully or not)."""

    kind: Literal["activate", "deactivate", "rebalance", "hybrid_weight_sync"]
    start: float
    end: float
    ok: bool = True
    detail: str = ""

    @property
    def duration_s(self) -> float:
        """``end - start``."""
        return self.end - self.start


@attrs.frozen
class TransitionEvent:
    """A `HybridState` transition (mirrors `dynsched_core.Transition`)."""

    time: float
    source: str
    target: str
    reason: str = ""


@attrs.frozen
class ReplicaModeEvent:
    """A GPU group entered a mode (for the resource-time layout plot).

    Attributes:
        time: Loop time of the change.
        group: GPU group name (``"trainer"``, ``"standalone-0"``, a replica id, ...).
        mode: ``rollout``, ``train``, ``weight_sync``, ``switching`` or ``idle``.
        gpus: GPUs in the group.
    """

    time: float
    group: str
    mode: GroupMode
    gpus: int = 1


@attrs.frozen
class RoleMoveEvent:
    """A role planner's move was applied (`dynsched_core.planner`).

    Attributes:
        time: Loop time when the move ended.
        direction: ``"to_trainer"`` or ``"to_rollout"``.
        replicas: Standalone replicas retired or started.
        before: The split before (`RoleSplit`).
        after: The split after.
        seconds: Seconds the move took.
    """

    time: float
    direction: Literal["to_trainer", "to_rollout"]
    replicas: int
    before: RoleSplit
    after: RoleSplit
    seconds: float


@attrs.frozen
class GuardRailEvent:
    """The driver's guard rails corrected a policy decision.

    Attributes:
        time: Loop time of the correction.
        global_steps: The step the decision was for.
        override: What was proposed, what was applied, by which rule and why
            (a `dynsched_core.GuardRailOverride`).
    """

    time: float
    global_steps: int
    override: Any


@attrs.frozen
class FailoverEvent:
    """The driver woke sleeping hybrid replicas because the routable set ran short.

    Emitted by `ScheduleDriver` when, while the trainer waits for samples, fewer than
    ``DriverOptions.min_routable_replicas`` replicas are routable (typically every
    standalone replica died) and the hybrid replicas sleep: they are woken with the
    current weights without waiting for the next weight sync.

    Attributes:
        time: Loop time when the failover started.
        end: Loop time when it finished.
        global_steps: The driver's parameter version at the time (its step counter).
        reason: Why (``"routable set empty"``, ``"1 routable < 2"``).
        routable_before: Live routable replicas before the failover.
        woken: The hybrid replicas woken (empty when the activation failed).
        ok: The activation succeeded.
        detail: The switch error, when it failed.
    """

    time: float
    end: float
    global_steps: int
    reason: str
    routable_before: tuple[str, ...]
    woken: tuple[str, ...]
    ok: bool = True
    detail: str = ""

    @property
    def duration_s(self) -> float:
        """``end - time``."""
        return self.end - self.time


Event = (
    RolloutEvent
    | StalenessResetEvent
    | TrainStepEvent
    | SwitchEvent
    | TransitionEvent
    | ReplicaModeEvent
    | GuardRailEvent
    | FailoverEvent
    | SampleEvent
)
Subscriber = Callable[[Any], None]


class EventBus:
    """Synchronous fan-out of events to subscribers.

    A subscriber that raises is logged with its traceback and unsubscribed from
    nothing: the emitter continues (observability must not break training).
    """

    def __init__(self) -> None:
        self._subs: list[tuple[Subscriber, tuple[type, ...] | None]] = []

    def subscribe(self, callback: Subscriber, *types: type) -> Callable[[], None]:
        """Deliver events (only of ``types`` when given) to ``callback``.

        Returns:
            A function that unsubscribes.
        """
        entry = (callback, types or None)
        self._subs.append(entry)

        def unsubscribe() -> None:
            if entry in self._subs:
                self._subs.remove(entry)

        return unsubscribe

    def emit(self, event: Any) -> None:
        """Deliver ``event`` to matching subscribers."""
        for callback, types in list(self._subs):
            if types is not None and not isinstance(event, types):
                continue
            try:
                callback(event)
            except Exception:
                logger.exception("event subscriber %r failed on %r", callback, event)

    def __bool__(self) -> bool:  # an empty bus is still a bus
        return True
