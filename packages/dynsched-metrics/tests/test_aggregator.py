"""Recorder and aggregator: one window at a time, each key once per cycle."""

from __future__ import annotations

from collections import Counter

import pytest
from dynsched_core import EventBus
from dynsched_core.events import (
    ReplicaModeEvent,
    RolloutEvent,
    StalenessResetEvent,
    SwitchEvent,
    TrainStepEvent,
    TransitionEvent,
)
from dynsched_metrics import (
    CYCLE_METRIC_KEYS,
    MQ_SIZE,
    RESOURCE_UTILIZATION,
    ROLLOUT_RESOURCE_UTILIZATION,
    STEP_GENERATED_SAMPLES,
    TRAIN_ALLOCATED_TIME_S,
    TRAIN_COMPUTE_TIME_S,
    TRAIN_RESOURCE_UTILIZATION,
    DictSink,
    MetricsAggregator,
    MetricsRecorder,
)
from dynsched_metrics._definitions import rollout_resource_utilization_reference
from hypothesis import given
from hypothesis import strategies as st


def step(n, t, *, compute=1.0, alloc=2.0, wait=0.0, mq=0, sync=False, hybrid=False):
    timings = {"update_actor": compute, "wait_for_enough_samples": wait, "step": alloc}
    return TrainStepEvent(n, t, timings, alloc, mq, sync, hybrid)


def test_recorder_builds_windows_with_seed_correction_and_trailing_idle():
    bus = EventBus()
    rec = MetricsRecorder(bus)
    bus.emit(RolloutEvent(0.0, 0, 0, "seed"))
    bus.emit(RolloutEvent(2.0, 4, 4, "submit"))
    bus.emit(RolloutEvent(6.0, 3, 4, "complete"))
    bus.emit(StalenessResetEvent(8.0, 1, 1))  # closes the window at "now" = 8
    bus.emit(RolloutEvent(9.0, 4, 8, "capacity"))
    bus.emit(StalenessResetEvent(10.0, 2, 0))
    w0, w1 = rec.windows
    assert (w0.start, w0.end, w0.param_version) == (0.0, 8.0, 1)
    assert list(w0.capacity) == [4, 4, 4]  # seed placeholder corrected in place
    assert w0.utilization() == pytest.approx(22 / 32)
    assert w0.step_generated_samples == 1 and w0.completed == 1
    # the next window opens at the reset with the state then (3 active, cap 4)
    assert w1.points() == [(8.0, 3, 4), (9.0, 4, 8)]
    assert w1.utilization() == pytest.approx((1 * 3 + 1 * 4) / (1 * 4 + 1 * 8))
    assert w1.step_generated_samples == 0
    assert rec.current_window is not None and rec.current_window.points() == [(10.0, 4, 8)]


def test_recorder_keeps_cycles_transitions_modes_switches():
    rec = MetricsRecorder()
    rec(step(1, 1.0))
    rec(step(2, 2.0, sync=True))
    rec(step(3, 3.0))
    rec(TransitionEvent(0.5, "STANDALONE_ONLY", "ACTIVATING"))
    rec(ReplicaModeEvent(0.5, "trainer", "switching", 8))
    rec(SwitchEvent("activate", 0.5, 0.7))
    rec("not an event")
    assert [s.step for s in rec.cycles[0].steps] == [1, 2]
    assert [s.step for s in rec.current_cycle.steps] == [3]
    assert len(rec.transitions) == len(rec.replica_modes) == len(rec.switches) == 1
    assert rec.mq_sizes() == [(1, 0), (2, 0), (3, 0)]
    assert rec.last_time == 3.0


def _scripted(bus, *, cycles, T, reset_first):
    """A small hand-made run: per micro-step 1 submit + 1 complete, reset at each sync."""
    t = 0.0
    n = 0
    bus.emit(RolloutEvent(t, 0, 0, "seed"))
    for c in range(cycles):
        for i in range(T):
            n += 1
            bus.emit(RolloutEvent(t + 0.1, 2, 4, "submit"))
            bus.emit(RolloutEvent(t + 0.6, 1, 4, "complete"))
            t += 1.0
            sync = i == T - 1
            ev = step(
                n, t, compute=0.5, alloc=1.0, wait=0.25, mq=10 * n, sync=sync, hybrid=(c % 2 == 0)
            )
            if sync and reset_first:
                bus.emit(StalenessResetEvent(t, c + 1, T))
                bus.emit(ev)
            elif sync:
                bus.emit(ev)
                bus.emit(StalenessResetEvent(t, c + 1, T))
            else:
                bus.emit(ev)
    return n


@pytest.mark.parametrize("reset_first", [False, True])
def test_aggregator_emits_each_key_once_per_cycle_at_its_sync_step(reset_first):
    bus = EventBus()
    sink = DictSink()
    agg = MetricsAggregator(hybrid_gpus=8, standalone_gpus=24, sinks=[sink], bus=bus)
    _scripted(bus, cycles=4, T=3, reset_first=reset_first)
    assert [r.step for r in agg.records] == [3, 6, 9, 12]
    assert [r.cycle for r in agg.records] == [0, 1, 2, 3]
    for r in agg.records:
        assert tuple(r.metrics) == CYCLE_METRIC_KEYS
        assert r.num_steps == 3
    # every key exactly once per step across the exported rows
    per_key = Counter((row["step"], k) for row in sink.rows for k in row if k != "step")
    assert set(per_key.values()) == {1}
    assert len(per_key) == 4 * len(CYCLE_METRIC_KEYS)

    first = agg.records[0].metrics
    assert first[TRAIN_COMPUTE_TIME_S] == pytest.approx(1.5)
    assert first[TRAIN_ALLOCATED_TIME_S] == pytest.approx(3.0)
    assert first[TRAIN_RESOURCE_UTILIZATION] == pytest.approx(0.5)
    assert first[MQ_SIZE] == 30  # last snapshot of the cycle, not the mean
    assert first[STEP_GENERATED_SAMPLES] == 3
    # rollout window 0 = seed .. first reset at t=3
    w0 = agg.recorder.windows[0]
    expected_rollout = rollout_resource_utilization_reference(
        w0.points(), 3.0, seed_placeholder=True
    )
    assert first[ROLLOUT_RESOURCE_UTILIZATION] == pytest.approx(expected_rollout)
    # cycle 0: hybrid did rollout: x = 0.75 / 3 ; cycle 1: no hybrid rollout -> x = 0
    assert agg.records[0].x == pytest.approx(0.25)
    assert agg.records[1].x == 0.0
    u_r1 = agg.records[1].metrics[ROLLOUT_RESOURCE_UTILIZATION]
    assert agg.records[1].metrics[RESOURCE_UTILIZATION] == pytest.approx((8 * 0.5 + 24 * u_r1) / 32)
    assert agg.drain() == agg.records
    assert agg.drain() == []


def test_each_cycle_gets_its_own_window_not_a_shifted_one():
    bus = EventBus()
    agg = MetricsAggregator(hybrid_gpus=1, standalone_gpus=1, bus=bus)
    # window 0: fully busy; window 1: idle
    bus.emit(RolloutEvent(0.0, 4, 4, "seed"))
    bus.emit(step(1, 1.0))
    bus.emit(step(2, 2.0, sync=True))
    bus.emit(StalenessResetEvent(2.0, 1, 4))
    bus.emit(RolloutEvent(2.0, 0, 4, "drain"))
    bus.emit(step(3, 3.0))
    bus.emit(step(4, 4.0, sync=True))
    bus.emit(StalenessResetEvent(4.0, 2, 0))
    r0, r1 = agg.records
    assert (r0.step, r0.metrics[ROLLOUT_RESOURCE_UTILIZATION]) == (2, 1.0)
    assert (r1.step, r1.metrics[ROLLOUT_RESOURCE_UTILIZATION]) == (4, 0.0)
    assert (r0.window_start, r0.window_end, r0.param_version) == (0.0, 2.0, 1)


def test_cycle_waits_for_its_window_and_finish_flushes():
    agg = MetricsAggregator(hybrid_gpus=2, standalone_gpus=2)
    agg.observe(RolloutEvent(0.0, 2, 4, "seed"))
    agg.observe(step(1, 1.0, sync=True))
    assert agg.records == []  # window not closed yet
    agg.observe(step(2, 2.0))  # partial trailing cycle
    out = agg.finish(now=4.0)
    assert [r.step for r in out] == [1, 2]
    assert out[0].metrics[ROLLOUT_RESOURCE_UTILIZATION] == pytest.approx(0.5)
    assert out[0].window_end == 4.0
    assert out[1].metrics[ROLLOUT_RESOURCE_UTILIZATION] == 0.0  # no window left
    assert agg.finish() == []  # nothing pending: idempotent


def test_without_rollout_pairing_cycles_emit_immediately():
    agg = MetricsAggregator(hybrid_gpus=2, standalone_gpus=0, pair_rollout_windows=False)
    agg.observe(step(1, 1.0, compute=1.0, alloc=4.0, sync=True))
    (r,) = agg.records
    assert r.metrics[TRAIN_RESOURCE_UTILIZATION] == 0.25
    assert r.metrics[RESOURCE_UTILIZATION] == 0.25  # b = 0, x = 0 -> U_train


def test_bad_gpu_counts_are_named():
    with pytest.raises(ValueError, match="hybrid_gpus"):
        MetricsAggregator(hybrid_gpus=-1, standalone_gpus=1)
    with pytest.raises(ValueError, match="standalone_gpus"):
        MetricsAggregator(hybrid_gpus=1, standalone_gpus=1.5)  # type: ignore[arg-type]


def test_failing_sink_does_not_stop_the_others():
    class Boom:
        def write(self, record):
            raise RuntimeError("boom")

        def close(self):
            pass

    good = DictSink()
    agg = MetricsAggregator(
        hybrid_gpus=1, standalone_gpus=1, sinks=[Boom(), good], pair_rollout_windows=False
    )
    agg.observe(step(1, 1.0, sync=True))
    assert len(good.rows) == 1


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=4),  # micro-steps in the cycle
            st.lists(st.tuples(st.integers(0, 10), st.integers(0, 8)), min_size=0, max_size=6),
            st.booleans(),  # reset before or after the sync step event
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(min_value=0, max_value=16),
    st.integers(min_value=0, max_value=16),
)
def test_random_runs_emit_every_key_once_per_cycle_all_in_range(cycles, a, b):
    bus = EventBus()
    agg = MetricsAggregator(hybrid_gpus=a, standalone_gpus=b, bus=bus)
    t, n = 0.0, 0
    bus.emit(RolloutEvent(t, 0, 0, "seed"))
    for c, (T, points, reset_first) in enumerate(cycles):
        for active, cap in points:
            t += 0.3
            bus.emit(RolloutEvent(t, active, cap, "submit"))
        for i in range(T):
            n += 1
            t += 1.0
            ev = step(
                n,
                t,
                compute=0.4 * i,
                alloc=1.0,
                wait=0.7,
                mq=n,
                sync=i == T - 1,
                hybrid=bool(c % 2),
            )
            if i == T - 1 and reset_first:
                bus.emit(StalenessResetEvent(t, c + 1, 0))
                bus.emit(ev)
            elif i == T - 1:
                bus.emit(ev)
                bus.emit(StalenessResetEvent(t, c + 1, 0))
            else:
                bus.emit(ev)
    assert len(agg.records) == len(cycles)
    assert len({r.step for r in agg.records}) == len(cycles)
    for r in agg.records:
        assert tuple(r.metrics) == CYCLE_METRIC_KEYS
        for key in (TRAIN_RESOURCE_UTILIZATION, ROLLOUT_RESOURCE_UTILIZATION, RESOURCE_UTILIZATION):
            assert 0.0 <= r.metrics[key] <= 1.0
        assert 0.0 <= r.x <= 1.0


def test_uncorrected_placeholder_seed_carries_over_to_the_next_window():
    rec = MetricsRecorder()
    rec(RolloutEvent(0.0, 0, 0, "seed"))
    rec(StalenessResetEvent(1.0, 1, 0))  # capacity still unknown
    rec(RolloutEvent(2.0, 2, 4, "submit"))
    rec(StalenessResetEvent(3.0, 2, 0))
    w0, w1 = rec.windows
    assert w0.utilization() == 0.0
    assert w1.points() == [(1.0, 0, 4), (2.0, 2, 4)]  # corrected once known
    assert w1.utilization() == (0 * 1 + 2 * 1) / (4 * 1 + 4 * 1)
