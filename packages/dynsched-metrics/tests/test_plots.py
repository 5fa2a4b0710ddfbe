"""Plots are written, readable, and built from the recorder's histories."""

from __future__ import annotations

from pathlib import Path

import pytest
from dynsched_core import EventBus
from dynsched_core.events import (
    ReplicaModeEvent,
    RolloutEvent,
    StalenessResetEvent,
    TrainStepEvent,
    TransitionEvent,
)
from dynsched_metrics import (
    MetricsAggregator,
    ModeInterval,
    mode_intervals,
    plot_queue_size,
    plot_resource_layout,
    plot_run,
    plot_utilizations,
)

PNG = b"\x89PNG\r\n\x1a\n"


def small_run():
    bus = EventBus()
    agg = MetricsAggregator(hybrid_gpus=8, standalone_gpus=8, bus=bus)
    bus.emit(RolloutEvent(0.0, 0, 0, "seed"))
    bus.emit(ReplicaModeEvent(0.0, "standalone", "rollout", 8))
    bus.emit(ReplicaModeEvent(0.0, "trainer", "rollout", 8))
    bus.emit(TransitionEvent(0.0, "STANDALONE_ONLY", "ACTIVATING"))
    bus.emit(TransitionEvent(0.2, "ACTIVATING", "HYBRID_ACTIVE"))
    t = 0.0
    for n in range(1, 7):
        bus.emit(RolloutEvent(t + 0.1, 6, 8, "submit"))
        bus.emit(TransitionEvent(t + 0.5, "HYBRID_ACTIVE", "DEACTIVATING"))
        bus.emit(ReplicaModeEvent(t + 0.5, "trainer", "switching", 8))
        bus.emit(TransitionEvent(t + 0.6, "DEACTIVATING", "STANDALONE_ONLY"))
        bus.emit(ReplicaModeEvent(t + 0.6, "trainer", "train", 8))
        bus.emit(RolloutEvent(t + 0.7, 3, 8, "complete"))
        t += 1.0
        sync = n % 2 == 0
        bus.emit(TrainStepEvent(n, t, {"update_actor": 0.3, "step": 1.0}, 1.0, 5 * n % 7, sync))
        if sync:
            bus.emit(ReplicaModeEvent(t, "standalone", "weight_sync", 8))
            bus.emit(ReplicaModeEvent(t, "trainer", "weight_sync", 8))
            bus.emit(StalenessResetEvent(t + 0.1, n // 2, 2))
            bus.emit(ReplicaModeEvent(t + 0.1, "standalone", "rollout", 8))
            bus.emit(TransitionEvent(t + 0.1, "STANDALONE_ONLY", "ACTIVATING"))
            bus.emit(TransitionEvent(t + 0.2, "ACTIVATING", "HYBRID_ACTIVE"))
            bus.emit(ReplicaModeEvent(t + 0.2, "trainer", "rollout", 8))
    return agg


def test_mode_intervals_cover_time_per_group():
    evs = [
        ReplicaModeEvent(0.0, "a", "rollout", 2),
        ReplicaModeEvent(0.0, "b", "train", 4),
        ReplicaModeEvent(1.0, "a", "switching", 2),
        ReplicaModeEvent(1.0, "a", "idle", 2),  # same instant: zero-length switching dropped
        ReplicaModeEvent(3.0, "b", "weight_sync", 4),
    ]
    out = mode_intervals(evs, end_time=4.0)
    assert list(out) == ["a", "b"]
    assert out["a"] == [
        ModeInterval("a", 0.0, 1.0, "rollout", 2),
        ModeInterval("a", 1.0, 4.0, "idle", 2),
    ]
    assert out["b"] == [
        ModeInterval("b", 0.0, 3.0, "train", 4),
        ModeInterval("b", 3.0, 4.0, "weight_sync", 4),
    ]
    assert mode_intervals([]) == {}


def test_plots_are_written(tmp_path):
    agg = small_run()
    assert len(agg.records) == 3
    paths = plot_run(agg, tmp_path / "plots", queue_capacity=8)
    for p in paths.values():
        with open(p, "rb") as fh:
            assert fh.read(8) == PNG
    # several runs on one figure, rows given as plain dicts
    rows = [r.as_dict() for r in agg.records]
    p = plot_utilizations({"dynamic": agg, "static": rows}, tmp_path / "u.png")
    assert Path(p).read_bytes()[:8] == PNG
    p = plot_queue_size({"dynamic": agg.recorder, "static": rows}, tmp_path / "q.png")
    assert Path(p).read_bytes()[:8] == PNG
    # layout from a plain list of events plus ground-truth intervals
    events = list(agg.recorder.replica_modes) + list(agg.recorder.train_steps)
    p = plot_resource_layout(
        events,
        tmp_path / "l.png",
        intervals={"truth": [(0.0, 2.0, "rollout"), (2.0, 6.0, "train")]},
    )
    assert Path(p).read_bytes()[:8] == PNG


def test_utilization_plot_refuses_a_bare_recorder(tmp_path):
    agg = small_run()
    with pytest.raises(TypeError, match="MetricsAggregator"):
        plot_utilizations(agg.recorder, tmp_path / "x.png")


def test_rollout_pool_row_merges_busy_and_idle_spans():
    from dynsched_metrics._plots import POOL_ROW, _pool_intervals

    pts = [(0.0, 0, 4), (1.0, 2, 4), (2.0, 3, 4), (3.0, 0, 4), (4.0, 5, 0), (5.0, 1, 4)]
    out = _pool_intervals(pts, end=6.0)
    assert [(iv.start, iv.end, iv.mode) for iv in out] == [
        (0.0, 1.0, "idle"),
        (1.0, 3.0, "rollout"),  # merged
        (3.0, 5.0, "idle"),  # no capacity counts as idle
        (5.0, 6.0, "rollout"),
    ]
    assert all(iv.group == POOL_ROW for iv in out)
