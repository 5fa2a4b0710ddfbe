"""Plots (``pip install dynsched-metrics[plot]``), drawn with matplotlib's Agg canvas.

No pyplot and no global backend switch: each function builds its own `Figure` on a
`FigureCanvasAgg`, saves it and returns the path, so it is safe in headless servers,
threads and test runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
from dynsched_core.events import ReplicaModeEvent, RolloutEvent, TrainStepEvent, TransitionEvent

from dynsched_metrics._aggregator import CycleMetrics, MetricsAggregator
from dynsched_metrics._definitions import (
    MQ_SIZE,
    RESOURCE_UTILIZATION,
    ROLLOUT_RESOURCE_UTILIZATION,
    TRAIN_RESOURCE_UTILIZATION,
)
from dynsched_metrics._recorder import MetricsRecorder

__all__ = [
    "MODE_COLORS",
    "POOL_ROW",
    "ModeInterval",
    "mode_intervals",
    "plot_queue_size",
    "plot_resource_layout",
    "plot_run",
    "plot_utilizations",
]

logger = logging.getLogger(__name__)

#: Colour of each GPU-group mode (rollout blue, train yellow as in the published figure).
MODE_COLORS: dict[str, str] = {
    "rollout": "#4C72B0",
    "train": "#F2C14E",
    "weight_sync": "#55A868",
    "switching": "#C44E52",
    "idle": "#E5E5E5",
}

#: How a hybrid state maps to a mode in the "hybrid state" row.
_STATE_MODE: dict[str, str] = {
    "STANDALONE_ONLY": "train",
    "standalone_only": "train",
    "ACTIVATING": "switching",
    "activating": "switching",
    "HYBRID_ACTIVE": "rollout",
    "hybrid_active": "rollout",
    "DEACTIVATING": "switching",
    "deactivating": "switching",
}


@attrs.frozen
class ModeInterval:
    """A GPU group in one mode over ``[start, end)``."""

    group: str
    start: float
    end: float
    mode: str
    gpus: int = 1


def _integer_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | os.PathLike[str]) -> str:
    out = os.fspath(path)
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(out)
    logger.debug("wrote %s", out)
    return out


# ---------------------------------------------------------------- series normalisation

RunData = Any  # MetricsAggregator | MetricsRecorder | Sequence[CycleMetrics | Mapping]


def _is_row(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "step" in obj


def _as_runs(data: Any) -> dict[str, Any]:
    """``{label: run}``; a single run becomes ``{"": run}``."""
    if isinstance(data, Mapping) and not _is_row(data):
        return {str(k): v for k, v in data.items()}
    return {"": data}


def _rows(run: Any) -> list[dict[str, Any]]:
    """Per-cycle rows ``{"step": s, <keys>}`` of one run."""
    if isinstance(run, MetricsAggregator):
        run = run.records
    if isinstance(run, MetricsRecorder):
        raise TypeError(
            "utilization plots need cycle records: pass a MetricsAggregator or its .records"
        )
    rows: list[dict[str, Any]] = []
    for item in run:
        if isinstance(item, CycleMetrics):
            rows.append(item.as_dict())
        elif _is_row(item):
            rows.append(dict(item))
        else:
            raise TypeError(f"expected CycleMetrics or a mapping with 'step', got {item!r}")
    return rows


def _queue_points(run: Any) -> list[tuple[int, float]]:
    if isinstance(run, MetricsAggregator):
        run = run.recorder if run.recorder.train_steps else run.records
    if isinstance(run, MetricsRecorder):
        return [(s.step, float(s.mq_size)) for s in run.train_steps]
    out: list[tuple[int, float]] = []
    for item in run:
        if isinstance(item, TrainStepEvent):
            out.append((item.step, float(item.mq_size)))
        else:
            row = item.as_dict() if isinstance(item, CycleMetrics) else item
            value = row.get(MQ_SIZE, row.get("mq_size"))
            if value is not None:
                out.append((int(row["step"]), float(value)))
    return out


# ---------------------------------------------------------------- plots over steps


def plot_queue_size(
    data: RunData,
    path: str | os.PathLike[str],
    *,
    queue_capacity: int | None = None,
    title: str = "Message queue size after each fit step (dynamic_resource/mq_size)",
) -> str:
    """Queue size over steps, one line per run.

    Args:
        data: One run or ``{label: run}``; a run is a `MetricsRecorder` or
            `MetricsAggregator` (every micro-step), a list of `TrainStepEvent`, or a
            list of `CycleMetrics` / rows with ``step`` and ``dynamic_resource/mq_size``
            (one point per cycle).
        path: PNG (or any matplotlib format) to write.
        queue_capacity: Draw the queue's capacity as a dashed line.
        title: Figure title.

    Returns:
        The written path.
    """
    fig = _figure(8.0, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    for label, run in _as_runs(data).items():
        pts = _queue_points(run)
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="." if len(pts) < 80 else None, label=label or None)
    if queue_capacity is not None:
        ax.axhline(queue_capacity, color="grey", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(_integer_locator())
    ax.set_ylabel("samples in queue")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _save(fig, path)


_UTIL_PANELS = (
    (TRAIN_RESOURCE_UTILIZATION, "train"),
    (ROLLOUT_RESOURCE_UTILIZATION, "rollout"),
    (RESOURCE_UTILIZATION, "cluster"),
)


def plot_utilizations(
    data: RunData,
    path: str | os.PathLike[str],
    *,
    title: str = "Resource utilization per sync cycle",
) -> str:
    """The three utilizations (train, rollout, cluster) over steps, one panel each.

    Args:
        data: One run or ``{label: run}``; a run is a `MetricsAggregator` or a list of
            `CycleMetrics` / rows (``step`` and the ``dynamic_resource/*`` keys).
        path: File to write.
        title: Figure title.

    Returns:
        The written path.
    """
    runs = {label: _rows(run) for label, run in _as_runs(data).items()}
    fig = _figure(8.0, 7.0)
    axes = fig.subplots(3, 1, sharex=True)
    for ax, (key, name) in zip(axes, _UTIL_PANELS, strict=True):
        for label, rows in runs.items():
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(
                    xs, ys, marker="o" if len(pts) < 60 else None, markersize=3, label=label or None
                )
        ax.set_ylim(-0.02, 1.05)
        ax.set_ylabel(f"{name}\nutilization")
        ax.set_title(key, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("training step")
    axes[-1].xaxis.set_major_locator(_integer_locator())
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


# ---------------------------------------------------------------- resource-time layout


def mode_intervals(
    events: Iterable[ReplicaModeEvent], end_time: float | None = None
) -> dict[str, list[ModeInterval]]:
    """Turn mode changes into ``[start, end)`` intervals per GPU group.

    Each `ReplicaModeEvent` starts a mode that lasts until the group's next event (or
    ``end_time``; default: the last event time of all groups). Zero-length intervals are
    dropped. Groups keep their first-appearance order.
    """
    evs = sorted(events, key=lambda e: e.time)  # stable: same-time order preserved
    if not evs:
        return {}
    end = max(e.time for e in evs) if end_time is None else float(end_time)
    out: dict[str, list[ModeInterval]] = {}
    current: dict[str, ReplicaModeEvent] = {}
    for e in evs:
        out.setdefault(e.group, [])
        prev = current.get(e.group)
        if prev is not None and e.time > prev.time:
            out[e.group].append(ModeInterval(e.group, prev.time, e.time, prev.mode, prev.gpus))
        current[e.group] = e
    for group, prev in current.items():
        if end > prev.time:
            out[group].append(ModeInterval(group, prev.time, end, prev.mode, prev.gpus))
    return out


def _state_intervals(
    transitions: Sequence[TransitionEvent], start: float, end: float
) -> list[ModeInterval]:
    out: list[ModeInterval] = []
    if not transitions:
        return out
    trs = sorted(transitions, key=lambda t: t.time)
    t0, state = start, trs[0].source
    for tr in trs:
        if tr.time > t0:
            out.append(ModeInterval("hybrid state", t0, tr.time, _STATE_MODE.get(state, "idle")))
        t0, state = max(t0, tr.time), tr.target
    if end > t0:
        out.append(ModeInterval("hybrid state", t0, end, _STATE_MODE.get(state, "idle")))
    return out


def _pool_intervals(points: Sequence[tuple[float, int, int]], end: float) -> list[ModeInterval]:
    """Rollout pool busy (``active > 0`` with capacity) / idle, merged, from the history."""
    out: list[ModeInterval] = []
    if not points:
        return out
    cols = np.asarray(points, dtype=np.float64)
    busy = (cols[:, 1] > 0) & (cols[:, 2] > 0)
    change = np.flatnonzero(np.diff(busy.astype(np.int8))) + 1
    starts = np.concatenate(([0], change))
    for i, k in enumerate(starts):
        t0 = float(cols[k, 0])
        t1 = float(cols[starts[i + 1], 0]) if i + 1 < len(starts) else end
        if t1 > t0:
            out.append(ModeInterval(POOL_ROW, t0, t1, "rollout" if busy[k] else "idle"))
    return out


#: Row drawn from the rollouter's history (busy while any sample is in flight).
POOL_ROW = "rollout pool (samples in flight)"


@attrs.frozen
class _LayoutEvents:
    """What the layout draws from: mode changes, state transitions, training steps, the
    rollouter's ``(t, active, capacity)`` history and the last event time."""

    modes: list[ReplicaModeEvent]
    transitions: list[TransitionEvent]
    steps: list[TrainStepEvent]
    pool_points: list[tuple[float, int, int]]
    last: float | None

    @classmethod
    def of(cls, data: MetricsRecorder | Iterable[Any]) -> _LayoutEvents:
        """From a recorder, or from any iterable of events (others are ignored)."""
        if isinstance(data, MetricsRecorder):
            return cls(
                list(data.replica_modes),
                list(data.transitions),
                list(data.train_steps),
                [p for w in data.all_windows() for p in w.points()],
                data.last_time,
            )
        items = list(data)
        times = [float(e.time) for e in items if isinstance(getattr(e, "time", None), int | float)]
        return cls(
            [e for e in items if isinstance(e, ReplicaModeEvent)],
            [e for e in items if isinstance(e, TransitionEvent)],
            [e for e in items if isinstance(e, TrainStepEvent)],
            [(e.time, e.active, e.capacity) for e in items if isinstance(e, RolloutEvent)],
            max(times) if times else None,
        )


@attrs.frozen
class _Layout:
    """The rows to draw (top to bottom ``order``) over ``[start, end]``, with their labels."""

    rows: dict[str, list[ModeInterval]]
    order: list[str]
    labels: dict[str, str]
    start: float
    end: float


def _layout(
    ev: _LayoutEvents,
    intervals: Mapping[str, Sequence[tuple[float, float, str]]] | None,
    end_time: float | None,
    groups: Sequence[str] | None,
    gpus: Mapping[str, int] | None,
    *,
    show_state: bool,
    show_pool: bool,
) -> _Layout:
    """Rows of the GPU groups, the extra ``intervals``, the rollout pool and the hybrid
    state; the time span; the row order and labels (``name (N GPUs)``)."""
    extra = {g: [ModeInterval(g, s, e, m) for s, e, m in iv] for g, iv in (intervals or {}).items()}
    candidates = [ev.last] + [iv.end for ivs in extra.values() for iv in ivs]
    if end_time is not None:
        end = float(end_time)
    else:
        end = max((c for c in candidates if c is not None), default=1.0)
    rows = mode_intervals(ev.modes, end)
    for group, ivs in extra.items():
        rows.setdefault(group, []).extend(ivs)
    if show_pool and ev.pool_points:
        rows[POOL_ROW] = _pool_intervals(ev.pool_points, end)
    starts = [iv.start for ivs in rows.values() for iv in ivs] + [t.time for t in ev.transitions]
    start = min(starts, default=0.0)
    if show_state and ev.transitions:
        rows["hybrid state"] = _state_intervals(ev.transitions, start, end)
    order = list(groups) if groups is not None else list(rows)
    order += [g for g in rows if g not in order]
    group_gpus = dict(gpus or {})
    for e in ev.modes:
        group_gpus.setdefault(e.group, e.gpus)
    labels = {}
    for group in order:
        n = group_gpus.get(group)
        labels[group] = f"{group} ({n} GPU{'s' if n != 1 else ''})" if n else group
    return _Layout(rows, order, labels, start, end)


def _draw_rows(ax: Any, layout: _Layout, origin: float) -> None:
    """One broken bar per row, coloured by mode, bottom row first."""
    order = layout.order
    for y, group in enumerate(reversed(order)):
        ivs = layout.rows.get(group, [])
        spans = [(iv.start - origin, iv.end - iv.start) for iv in ivs]
        colors = [MODE_COLORS.get(iv.mode, "#999999") for iv in ivs]
        if spans:
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors, edgecolor="none")
    ax.set_yticks(range(len(order)), labels=[layout.labels[g] for g in reversed(order)], fontsize=8)
    ax.set_ylim(-0.6, len(order) - 0.4)
    start, end = layout.start, layout.end
    ax.set_xlim(start - origin, (end if end > start else start + 1.0) - origin)


def _mark_steps(ax: Any, steps: Sequence[TrainStepEvent], layout: _Layout, origin: float) -> None:
    """A line at the end of each training step in the span (solid at weight syncs); the
    step numbers on the top axis when there are at most 40."""
    shown = [s for s in steps if layout.start <= s.time <= layout.end]
    for s in shown:
        ax.axvline(
            s.time - origin,
            color="black",
            linewidth=0.9 if s.is_sync_step else 0.5,
            linestyle="-" if s.is_sync_step else ":",
            alpha=0.7,
        )
    if 0 < len(shown) <= 40:
        top = ax.secondary_xaxis("top")
        top.set_xticks([s.time - origin for s in shown], labels=[str(s.step) for s in shown])
        top.tick_params(labelsize=7)
        top.set_xlabel("training step (end; solid line = weight sync)", fontsize=8)


def plot_resource_layout(
    data: MetricsRecorder | Iterable[Any],
    path: str | os.PathLike[str],
    *,
    intervals: Mapping[str, Sequence[tuple[float, float, str]]] | None = None,
    end_time: float | None = None,
    groups: Sequence[str] | None = None,
    gpus: Mapping[str, int] | None = None,
    show_state: bool = True,
    show_pool: bool = True,
    show_steps: bool = True,
    relative_time: bool = True,
    title: str = "Resource-time layout",
) -> str:
    """One row per GPU group, coloured by mode over time (the published design's picture).

    Rows, top to bottom: GPU groups from `ReplicaModeEvent` (first appearance order, or
    ``groups``), rows given in ``intervals``, the rollout pool (busy while the
    rollouter has samples in flight, from its ``(t, active, capacity)`` history), and
    the hybrid state (from the state-machine transitions: activating/deactivating drawn
    as switching, hybrid-active as rollout, standalone-only as train).

    Args:
        data: A `MetricsRecorder`, or an iterable of events (`ReplicaModeEvent`,
            `TransitionEvent`, `TrainStepEvent`, `RolloutEvent`); others are ignored.
        path: File to write.
        intervals: Extra rows ``{group: [(start, end, mode), ...]}`` (e.g. a simulator's
            ground truth per GPU group).
        end_time: Right edge (default: the last event time).
        groups: Row order, top to bottom (default: first appearance).
        gpus: GPUs per group for the row labels (default: from the events).
        show_state: Add the "hybrid state" row when there are transitions.
        show_pool: Add the rollout-pool row when there is a rollout history.
        show_steps: Mark the end of each training step (solid line at weight syncs) and
            label the steps on the top axis.
        relative_time: Time axis in seconds since the first drawn event.
        title: Figure title.

    Returns:
        The written path.
    """
    from matplotlib.patches import Patch

    ev = _LayoutEvents.of(data)
    layout = _layout(
        ev, intervals, end_time, groups, gpus, show_state=show_state, show_pool=show_pool
    )
    origin = layout.start if relative_time else 0.0
    fig = _figure(10.0, max(2.4, 0.45 * len(layout.order) + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    _draw_rows(ax, layout, origin)
    if show_steps:
        _mark_steps(ax, ev.steps, layout, origin)
    ax.set_xlabel("time since start (s)" if relative_time else "time (s)")
    handles = [Patch(facecolor=c, label=m.replace("_", " ")) for m, c in MODE_COLORS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_run(
    data: MetricsAggregator,
    out_dir: str | os.PathLike[str],
    *,
    prefix: str = "",
    queue_capacity: int | None = None,
) -> dict[str, str]:
    """Write the three plots of one run into ``out_dir``.

    Returns:
        ``{"queue_size": path, "utilization": path, "resource_layout": path}``.
    """
    base = os.fspath(out_dir)
    return {
        "queue_size": plot_queue_size(
            data, os.path.join(base, f"{prefix}queue_size.png"), queue_capacity=queue_capacity
        ),
        "utilization": plot_utilizations(data, os.path.join(base, f"{prefix}utilization.png")),
        "resource_layout": plot_resource_layout(
            data.recorder, os.path.join(base, f"{prefix}resource_layout.png")
        ),
    }
