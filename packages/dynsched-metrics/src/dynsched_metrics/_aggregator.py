"""`MetricsAggregator`: one sync window at a time, each key once per cycle."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
from dynsched_core import EventBus

from dynsched_metrics import _definitions as m
from dynsched_metrics._recorder import MetricsRecorder, RolloutWindow, TrainCycle

__all__ = ["CycleMetrics", "MetricsAggregator", "MetricsSink"]

logger = logging.getLogger(__name__)

WAIT_KEY = "wait_for_enough_samples"
STEP_KEY = "step"


@attrs.frozen
class CycleMetrics:
    """The metrics of one closed sync cycle.

    Attributes:
        cycle: 0-based cycle index.
        step: Global micro-step the cycle's metrics belong to (its sync step).
        metrics: Exactly the keys of `CYCLE_METRIC_KEYS`, each once.
        first_step: First micro-step of the cycle.
        num_steps: Micro-steps in the cycle.
        time: Loop time of the sync step.
        x: Fraction of the cycle the hybrid GPUs spent on rollout.
        wait_s: Summed ``wait_for_enough_samples`` of steps where hybrid did rollout.
        step_s: Summed ``step`` time of the cycle.
        window_start: Start of the paired rollout window (None: no window).
        window_end: End of the paired rollout window.
        param_version: Version announced by the reset that closed the window.
    """

    cycle: int
    step: int
    metrics: Mapping[str, float]
    first_step: int
    num_steps: int
    time: float
    x: float
    wait_s: float
    step_s: float
    window_start: float | None = None
    window_end: float | None = None
    param_version: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{"step", "cycle", <metric keys>...}``, JSON-serialisable."""
        return {"step": self.step, "cycle": self.cycle, **self.metrics}


@runtime_checkable
class MetricsSink(Protocol):
    """Receives every closed cycle (exporters implement this)."""

    def write(self, record: CycleMetrics) -> None:
        """Export one cycle's metrics."""
        ...

    def close(self) -> None:
        """Flush and release resources."""
        ...


class MetricsAggregator:
    """Closes exactly one sync window at a time and emits each key once per cycle.

    A *cycle* is the trainer micro-steps up to and including a step that ends with a
    weight sync (``TrainStepEvent.is_sync_step``); its rollout window is the staleness
    window closed by that sync's reset. The n-th closed cycle is paired with the n-th
    closed rollout window, whichever arrives first. For each pair one `CycleMetrics`
    is built, stamped with the cycle's sync step, written to every sink and appended to
    `records`:

    - ``train_resource_utilization`` = summed compute / summed allocated time, plus the
      raw ``train_compute_time_s`` and ``train_allocated_time_s`` (sums over the cycle);
    - ``rollout_resource_utilization`` of the paired window (per-interval capacity,
      closed at the reset);
    - ``resource_utilization`` with ``x = clip(sum wait / sum step, 0, 1)`` where the
      wait counts only steps whose ``hybrid_did_rollout`` is true (x = 0 otherwise);
    - ``mq_size`` = last post-step snapshot; ``step_generated_samples`` of the window.

    The pairing assumes one staleness reset per weight sync, as in the reference loop
    (the reset may come before or after the sync step's `TrainStepEvent`); a host that
    also resets at start-up must do so before attaching the aggregator.

    Args:
        hybrid_gpus: ``a``, hybrid-capable trainer GPUs.
        standalone_gpus: ``b``, standalone rollout GPUs.
        compute_keys: Timing keys that count as training compute.
        sinks: Exporters receiving each record (see `build_sink`).
        recorder: Recorder to read histories from (a new one if None).
        bus: Subscribe the recorder to this bus right away.
        pair_rollout_windows: False when the host has no rollout events: cycles are
            emitted as soon as they close, with rollout utilization 0.0 and
            step_generated_samples 0.

    Raises:
        ValueError: a GPU count is not an int >= 0 (names the argument).
    """

    def __init__(
        self,
        *,
        hybrid_gpus: int,
        standalone_gpus: int,
        compute_keys: Sequence[str] = m.TRAIN_COMPUTE_KEYS,
        sinks: Iterable[MetricsSink] = (),
        recorder: MetricsRecorder | None = None,
        bus: EventBus | None = None,
        pair_rollout_windows: bool = True,
    ) -> None:
        for name, value in (("hybrid_gpus", hybrid_gpus), ("standalone_gpus", standalone_gpus)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.hybrid_gpus = hybrid_gpus
        self.standalone_gpus = standalone_gpus
        self.compute_keys = tuple(compute_keys)
        self.sinks: list[MetricsSink] = list(sinks)
        self.pair_rollout_windows = pair_rollout_windows
        self.records: list[CycleMetrics] = []
        self._pending_cycles: deque[TrainCycle] = deque()
        self._pending_windows: deque[RolloutWindow] = deque()
        self._drained = 0
        self._listeners: list[Callable[[CycleMetrics], None]] = []
        self.recorder = recorder if recorder is not None else MetricsRecorder()
        self.recorder.on_cycle_closed(self._on_cycle)
        self.recorder.on_window_closed(self._on_window)
        if bus is not None:
            self.recorder.attach(bus)

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> MetricsAggregator:
        """Take ``a``/``b`` from a config exposing ``hybrid_gpus`` and ``standalone_gpus``
        (e.g. `dynsched_core.DynamicScheduleConfig`); ``kwargs`` as the constructor."""
        return cls(
            hybrid_gpus=int(config.hybrid_gpus),
            standalone_gpus=int(config.standalone_gpus),
            **kwargs,
        )

    # ------------------------------------------------------------------ wiring
    def attach(self, bus: EventBus) -> Callable[[], None]:
        """Subscribe the recorder to ``bus``; returns the unsubscribe function."""
        return self.recorder.attach(bus)

    def observe(self, event: Any) -> None:
        """Feed one event by hand (same as emitting it on an attached bus)."""
        self.recorder(event)

    def add_sink(self, sink: MetricsSink) -> None:
        """Also export to ``sink`` from now on."""
        self.sinks.append(sink)

    def on_record(self, listener: Callable[[CycleMetrics], None]) -> None:
        """Call ``listener(record)`` for each closed cycle."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ pairing
    def _on_cycle(self, cycle: TrainCycle) -> None:
        self._pending_cycles.append(cycle)
        self._pair()

    def _on_window(self, window: RolloutWindow) -> None:
        self._pending_windows.append(window)
        self._pair()

    def _pair(self) -> None:
        while self._pending_cycles:
            if self.pair_rollout_windows:
                if not self._pending_windows:
                    return
                window: RolloutWindow | None = self._pending_windows.popleft()
            else:
                window = None
            self._emit(self._pending_cycles.popleft(), window, None)

    def finish(self, now: float | None = None) -> list[CycleMetrics]:
        """End of run: emit cycles still waiting for their rollout window.

        The first waiting cycle gets the open window closed at ``now`` (default: the
        last event time seen); any further one gets no window (rollout utilization 0).
        A trailing partial cycle (no sync step yet) is emitted only if it has steps.

        Returns:
            The records emitted by this call.
        """
        before = len(self.records)
        end = now if now is not None else self.recorder.last_time
        partial = self.recorder.current_cycle
        if partial.steps:
            self._pending_cycles.append(partial)
            self.recorder.current_cycle = TrainCycle(partial.index + 1)
        self._pair()
        open_window = self.recorder.current_window
        while self._pending_cycles:
            cycle = self._pending_cycles.popleft()
            window = None
            if self._pending_windows:
                window = self._pending_windows.popleft()
            elif open_window is not None and self.pair_rollout_windows:
                window, open_window = open_window, None
            self._emit(cycle, window, end)
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if callable(flush):
                flush()
        return self.records[before:]

    def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks:
            sink.close()

    def drain(self) -> list[CycleMetrics]:
        """Records emitted since the previous call (for pull-style loggers)."""
        out = self.records[self._drained :]
        self._drained = len(self.records)
        return out

    # ------------------------------------------------------------------ computing
    def compute(
        self, cycle: TrainCycle, window: RolloutWindow | None, now: float | None = None
    ) -> CycleMetrics:
        """The `CycleMetrics` of ``cycle`` with its rollout ``window`` (no side effects)."""
        steps = cycle.steps
        compute_s = sum(m.train_compute_time(s.timings, self.compute_keys) for s in steps)
        allocated_s = sum(float(s.allocated_s) for s in steps)
        wait_s = sum(float(s.timings.get(WAIT_KEY, 0.0)) for s in steps if s.hybrid_did_rollout)
        step_s = sum(float(s.timings.get(STEP_KEY, s.allocated_s)) for s in steps)
        x = m.hybrid_rollout_fraction(wait_s, step_s)
        u_train = m.train_resource_utilization(compute_s, allocated_s)
        if window is not None:
            u_rollout = window.utilization(now)
            generated = window.step_generated_samples
        else:
            u_rollout = 0.0
            generated = 0
        u_cluster = m.cluster_resource_utilization(
            u_train, u_rollout, x, self.hybrid_gpus, self.standalone_gpus
        )
        metrics: dict[str, float] = {
            m.TRAIN_RESOURCE_UTILIZATION: u_train,
            m.TRAIN_COMPUTE_TIME_S: compute_s,
            m.TRAIN_ALLOCATED_TIME_S: allocated_s,
            m.ROLLOUT_RESOURCE_UTILIZATION: u_rollout,
            m.RESOURCE_UTILIZATION: u_cluster,
            m.MQ_SIZE: int(steps[-1].mq_size),
            m.STEP_GENERATED_SAMPLES: int(generated),
        }
        window_end = None
        if window is not None:
            window_end = window.end if window.end is not None else now
        return CycleMetrics(
            cycle=cycle.index,
            step=int(steps[-1].step),
            metrics=metrics,
            first_step=int(steps[0].step),
            num_steps=len(steps),
            time=float(steps[-1].time),
            x=x,
            wait_s=wait_s,
            step_s=step_s,
            window_start=window.start if window is not None else None,
            window_end=window_end,
            param_version=window.param_version if window is not None else None,
        )

    def _emit(self, cycle: TrainCycle, window: RolloutWindow | None, now: float | None) -> None:
        record = self.compute(cycle, window, now)
        self.records.append(record)
        for sink in self.sinks:
            try:
                sink.write(record)
            except Exception:
                logger.exception("metrics sink %r failed on cycle %d", sink, record.cycle)
        for listener in list(self._listeners):
            try:
                listener(record)
            except Exception:
                logger.exception("metrics listener %r failed on cycle %d", listener, record.cycle)

    def __repr__(self) -> str:
        return (
            f"MetricsAggregator(hybrid_gpus={self.hybrid_gpus}, "
            f"standalone_gpus={self.standalone_gpus}, records={len(self.records)}, "
            f"pending_cycles={len(self._pending_cycles)}, "
            f"pending_windows={len(self._pending_windows)})"
        )
