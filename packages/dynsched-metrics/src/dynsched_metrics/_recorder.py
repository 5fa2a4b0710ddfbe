"""`MetricsRecorder`: builds the metric histories from a core `EventBus`."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from dynsched_core import EventBus
from dynsched_core.events import (
    ReplicaModeEvent,
    RolloutEvent,
    StalenessResetEvent,
    SwitchEvent,
    TrainStepEvent,
    TransitionEvent,
)

from dynsched_metrics._definitions import HistoryPoint, rollout_resource_utilization_arrays

__all__ = ["MetricsRecorder", "RolloutWindow", "TrainCycle"]

logger = logging.getLogger(__name__)


class RolloutWindow:
    """The ``(t, active, capacity)`` history of one staleness window.

    A window opens at the first rollout point (the rollouter's seed) or at a staleness
    reset, and is closed by the next `StalenessResetEvent` ("now" of that reset).
    Points are kept in compact typed arrays (24 bytes per point), read with
    `times`/`active`/`capacity` as numpy views.

    Attributes:
        index: 0-based position among the run's windows.
        start: Time of the first point (the window's start).
        end: Closing time, None while open.
        seed_placeholder: True when the first point is the start-up seed recorded before
            the capacity was known (its capacity is corrected by the next point).
        completed: Number of ``complete`` points (samples finished in this window).
        param_version: Version announced by the reset that closed the window.
        reported_step_generated_samples: The closing reset's own count, when it has one.
    """

    def __init__(self, index: int, start: float, *, seed_placeholder: bool = False) -> None:
        self.index = index
        self.start = float(start)
        self.end: float | None = None
        self.seed_placeholder = seed_placeholder
        self.completed = 0
        self.param_version: int | None = None
        self.reported_step_generated_samples: int | None = None
        self._t: array[float] = array("d")
        self._a: array[int] = array("q")
        self._c: array[int] = array("q")

    def append(self, time: float, active: int, capacity: int) -> None:
        """Add a point; the first real capacity corrects a placeholder seed."""
        if self.seed_placeholder and len(self._c) == 1 and self._c[0] == 0:
            self._c[0] = int(capacity)
        self._t.append(float(time))
        self._a.append(int(active))
        self._c.append(int(capacity))

    @property
    def closed(self) -> bool:
        """True once a staleness reset ended the window."""
        return self.end is not None

    @property
    def times(self) -> np.ndarray:
        """Point times (a numpy copy)."""
        return np.array(self._t, dtype=np.float64)

    @property
    def active(self) -> np.ndarray:
        """Active task count of each point (a numpy copy)."""
        return np.array(self._a, dtype=np.int64)

    @property
    def capacity(self) -> np.ndarray:
        """Capacity of each point (a numpy copy)."""
        return np.array(self._c, dtype=np.int64)

    @property
    def last(self) -> HistoryPoint | None:
        """The latest point, or None."""
        if not self._t:
            return None
        return (self._t[-1], self._a[-1], self._c[-1])

    def points(self) -> list[HistoryPoint]:
        """The history as a list of ``(t, active, capacity)`` tuples."""
        return list(zip(self._t, self._a, self._c, strict=True))

    def __len__(self) -> int:
        return len(self._t)

    def __iter__(self) -> Iterator[HistoryPoint]:
        return iter(self.points())

    @property
    def step_generated_samples(self) -> int:
        """Samples completed in this window (the reset's count when it reported one)."""
        if self.reported_step_generated_samples is not None:
            return self.reported_step_generated_samples
        return self.completed

    def utilization(self, now: float | None = None) -> float:
        """Rollout utilization of the window, closed at ``end`` (or ``now`` while open)."""
        end = self.end if self.end is not None else now
        if not self._t:
            return 0.0
        if end is not None and end < self._t[-1]:
            end = self._t[-1]
        # Temporary zero-copy views: released before the next append can resize.
        return rollout_resource_utilization_arrays(
            np.frombuffer(self._t, dtype=np.float64),
            np.frombuffer(self._a, dtype=np.int64),
            np.frombuffer(self._c, dtype=np.int64),
            end,
            seed_placeholder=self.seed_placeholder,
            validate=False,
        )

    def __repr__(self) -> str:
        return (
            f"RolloutWindow(index={self.index}, start={self.start}, end={self.end}, "
            f"points={len(self)}, completed={self.completed})"
        )


class TrainCycle:
    """The trainer micro-steps of one sync cycle (closed by the step with a weight sync).

    Attributes:
        index: 0-based cycle index.
        steps: The `TrainStepEvent`\\ s in arrival order.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.steps: list[TrainStepEvent] = []

    @property
    def closed(self) -> bool:
        """True when the last step ended with a weight sync."""
        return bool(self.steps) and self.steps[-1].is_sync_step

    @property
    def last_step(self) -> int:
        """Global step of the last micro-step (the step the cycle's metrics belong to)."""
        return self.steps[-1].step

    def __repr__(self) -> str:
        steps = [s.step for s in self.steps]
        return f"TrainCycle(index={self.index}, steps={steps})"


WindowListener = Callable[[RolloutWindow], None]
CycleListener = Callable[[TrainCycle], None]


class MetricsRecorder:
    """Subscribes to a core `EventBus` and keeps the histories the metrics need.

    - rollout points, one `RolloutWindow` per staleness window (`windows`, the open
      one in `current_window`);
    - trainer micro-steps per sync cycle (`cycles`, `current_cycle`, all in
      `train_steps`);
    - state-machine transitions (`transitions`), switches (`switches`) and GPU-group
      modes (`replica_modes`) for the resource-time layout.

    The recorder is also a plain callable, so ``bus.subscribe(recorder)`` works, and it
    can be fed events directly (``recorder(event)``) when no bus exists.

    Example:
        >>> from dynsched_core.events import EventBus, RolloutEvent, StalenessResetEvent
        >>> bus = EventBus(); rec = MetricsRecorder(bus)
        >>> bus.emit(RolloutEvent(0.0, 0, 4, "seed")); bus.emit(RolloutEvent(1.0, 4, 4, "submit"))
        >>> bus.emit(StalenessResetEvent(2.0, 1, 0))
        >>> rec.windows[0].utilization()
        0.5
    """

    def __init__(self, bus: EventBus | None = None) -> None:
        self.windows: list[RolloutWindow] = []
        self.current_window: RolloutWindow | None = None
        self.cycles: list[TrainCycle] = []
        self.current_cycle: TrainCycle = TrainCycle(0)
        self.train_steps: list[TrainStepEvent] = []
        self.resets: list[StalenessResetEvent] = []
        self.transitions: list[TransitionEvent] = []
        self.switches: list[SwitchEvent] = []
        self.replica_modes: list[ReplicaModeEvent] = []
        self.rollout_event_count = 0
        self.last_time: float | None = None
        self._last_point: HistoryPoint | None = None
        self._window_listeners: list[WindowListener] = []
        self._cycle_listeners: list[CycleListener] = []
        self._unsubscribe: list[Callable[[], None]] = []
        if bus is not None:
            self.attach(bus)

    # ------------------------------------------------------------------ wiring
    def attach(self, bus: EventBus) -> Callable[[], None]:
        """Subscribe to ``bus``; returns a function that unsubscribes."""
        unsub = bus.subscribe(self)
        self._unsubscribe.append(unsub)
        return unsub

    def detach(self) -> None:
        """Unsubscribe from every bus this recorder was attached to."""
        for unsub in self._unsubscribe:
            unsub()
        self._unsubscribe.clear()

    def on_window_closed(self, listener: WindowListener) -> None:
        """Call ``listener(window)`` each time a staleness reset closes a window."""
        self._window_listeners.append(listener)

    def on_cycle_closed(self, listener: CycleListener) -> None:
        """Call ``listener(cycle)`` each time a sync step closes a train cycle."""
        self._cycle_listeners.append(listener)

    # ------------------------------------------------------------------ events
    def __call__(self, event: Any) -> None:
        """Record one event (unknown types are ignored)."""
        if isinstance(event, RolloutEvent):
            self._on_rollout(event)
        elif isinstance(event, StalenessResetEvent):
            self._on_reset(event)
        elif isinstance(event, TrainStepEvent):
            self._on_train_step(event)
        elif isinstance(event, TransitionEvent):
            self._touch(event.time)
            self.transitions.append(event)
        elif isinstance(event, ReplicaModeEvent):
            self._touch(event.time)
            self.replica_modes.append(event)
        elif isinstance(event, SwitchEvent):
            self._touch(event.end)
            self.switches.append(event)

    record = __call__

    def _touch(self, t: float) -> None:
        if self.last_time is None or t > self.last_time:
            self.last_time = float(t)

    def _on_rollout(self, e: RolloutEvent) -> None:
        self.rollout_event_count += 1
        window = self.current_window
        if window is None:
            window = RolloutWindow(len(self.windows), e.time, seed_placeholder=e.kind == "seed")
            self.current_window = window
        t = float(e.time)
        last = window.last
        if last is not None and t < last[0]:
            logger.warning("rollout event at %s before the previous one (%s); clamped", t, last[0])
            t = last[0]
        window.append(t, e.active, e.capacity)
        if e.kind == "complete":
            window.completed += 1
        self._last_point = (t, int(e.active), int(e.capacity))
        self._touch(t)

    def _on_reset(self, e: StalenessResetEvent) -> None:
        self.resets.append(e)
        t = float(e.time)
        window = self.current_window
        if window is None:
            window = RolloutWindow(len(self.windows), t)
        last = window.last
        if last is not None and t < last[0]:
            # e.g. the rollouter stamps its ``reset`` point a few microseconds after the
            # StalenessResetEvent it built first: close at that point instead.
            logger.debug("staleness reset at %s before the last rollout point (%s)", t, last[0])
            t = last[0]
        window.end = t
        window.param_version = int(e.param_version)
        window.reported_step_generated_samples = int(e.step_generated_samples)
        self.windows.append(window)
        # A seed whose placeholder capacity was never corrected stays a placeholder.
        pending_seed = window.seed_placeholder and len(window) == 1 and window.capacity[0] == 0
        nxt = RolloutWindow(len(self.windows), t, seed_placeholder=pending_seed)
        if self._last_point is not None:
            nxt.append(t, self._last_point[1], self._last_point[2])
        self.current_window = nxt
        self._touch(t)
        for listener in list(self._window_listeners):
            listener(window)

    def _on_train_step(self, e: TrainStepEvent) -> None:
        self.train_steps.append(e)
        self.current_cycle.steps.append(e)
        self._touch(e.time)
        if e.is_sync_step:
            cycle = self.current_cycle
            self.cycles.append(cycle)
            self.current_cycle = TrainCycle(len(self.cycles))
            for listener in list(self._cycle_listeners):
                listener(cycle)

    # ------------------------------------------------------------------ views
    def all_windows(self) -> list[RolloutWindow]:
        """Closed windows plus the open one (if it has points)."""
        out = list(self.windows)
        if self.current_window is not None and len(self.current_window):
            out.append(self.current_window)
        return out

    def mq_sizes(self) -> list[tuple[int, int]]:
        """``(step, mq_size)`` after every recorded micro-step."""
        return [(s.step, s.mq_size) for s in self.train_steps]

    def __repr__(self) -> str:
        return (
            f"MetricsRecorder(windows={len(self.windows)}, cycles={len(self.cycles)}, "
            f"train_steps={len(self.train_steps)}, transitions={len(self.transitions)}, "
            f"replica_modes={len(self.replica_modes)})"
        )
