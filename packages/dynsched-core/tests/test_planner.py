"""The role planner's records, speed models and decision (`dynsched_core.planner`)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from dynsched_core import EventBus
from dynsched_core.events import ReplicaModeEvent, RolloutEvent, SampleEvent, TrainStepEvent
from dynsched_core.planner import (
    PlannerWorkload,
    RoleMove,
    RoleMover,
    RolePlanner,
    RolePlannerOptions,
    RoleSplit,
    RolloutSpeedModel,
    TrainerSpeedModel,
    nnls,
)
from hypothesis import event, given, settings
from hypothesis import strategies as st

# ---------------------------------------------------------------------------- records


def test_split_and_move_records_validate_and_name_the_field() -> None:
    s = RoleSplit(trainer_gpus=16, standalone_replicas=2, gpus_per_replica=8)
    assert s.total_gpus == 32
    after = s.moved("to_trainer", 1)
    assert (after.trainer_gpus, after.standalone_replicas, after.total_gpus) == (24, 1, 32)
    m = RoleMove(direction="to_trainer", replicas=1, before=s, after=after)
    assert m.gpus == 8
    with pytest.raises(ValueError, match="RoleSplit.trainer_gpus"):
        RoleSplit(trainer_gpus=0, standalone_replicas=1, gpus_per_replica=8)
    with pytest.raises(ValueError, match="RoleMove.direction"):
        RoleMove(direction="sideways", replicas=1, before=s, after=after)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="RoleMove.after"):
        RoleMove(direction="to_rollout", replicas=1, before=s, after=after)
    with pytest.raises(ValueError, match="RoleSplit.standalone_replicas"):
        s.moved("to_trainer", 3)
    with pytest.raises(ValueError, match="RolePlannerOptions.every_n_syncs"):
        RolePlannerOptions(every_n_syncs=0)
    # the last standalone replica is never retired: 0 refused, naming the field and range
    with pytest.raises(
        ValueError, match=r"RolePlannerOptions.min_standalone_replicas must be an int >= 1, got 0"
    ):
        RolePlannerOptions(min_standalone_replicas=0)
    with pytest.raises(TypeError, match=r"min_standalone_replicas must be an int >= 1"):
        RolePlannerOptions(min_standalone_replicas=1.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- fitting


def test_nnls_is_exact_and_never_negative() -> None:
    rows = [[1.0, x, x * x] for x in (1.0, 2.0, 3.0, 4.0, 5.0)]
    y = [2.0 + 0.5 * x for x in (1.0, 2.0, 3.0, 4.0, 5.0)]
    assert nnls(rows, y) == pytest.approx((2.0, 0.5, 0.0), abs=1e-9)
    # the unconstrained fit has a negative slope: the constrained one clips it to 0
    coef = nnls([[1.0, x] for x in (1.0, 2.0, 3.0)], [3.0, 2.0, 1.0])
    assert coef == pytest.approx((2.0, 0.0))


def test_trainer_model_recovers_a_known_curve_with_a_covering_interval() -> None:
    a, b, c = 6.0, 0.004, 0.3
    rng = random.Random(1)
    model = TrainerSpeedModel(window=200)
    for _ in range(120):
        w = rng.choice([8, 16, 24, 32])
        work = rng.uniform(2e5, 4e5)
        model.observe(w, (a + b * work / w + c * w) * rng.gauss(1.0, 0.002), work)
    coef = model.coefficients
    assert coef is not None
    assert coef[0] == pytest.approx(a, rel=0.25)
    assert coef[1] == pytest.approx(b, rel=0.05)
    assert coef[2] == pytest.approx(c, rel=0.3)
    for w in (12, 40):  # between and beyond the sizes seen
        truth = a + b * 3e5 / w + c * w
        p = model.predict(w, 3e5)
        assert p.low <= truth <= p.high
        assert p.mean == pytest.approx(truth, rel=0.05)


def test_trainer_model_before_a_second_size_spans_the_judged_exponents() -> None:
    model = TrainerSpeedModel()
    for _ in range(4):
        model.observe(16, 100.0, 1.0)
    assert model.coefficients is None
    p = model.predict(32, 1.0)
    assert p.low == pytest.approx(100.0 * 0.5**1.0)
    assert p.high == pytest.approx(100.0 * 0.5**0.7)
    assert p.mean == pytest.approx(100.0 * 0.5**0.9)


def test_rollout_model_recovers_latency_against_running_samples() -> None:
    alpha, beta = 120.0, 6.0
    rng = random.Random(2)
    model = RolloutSpeedModel(window=100)
    for _ in range(60):
        n = rng.uniform(4.0, 16.0)
        replicas = rng.choice([1, 2, 3])
        dur = 600.0
        lat = (alpha + beta * n) * rng.gauss(1.0, 0.01)
        in_flight_s = n * replicas * dur
        produced = round(in_flight_s / lat)
        assert model.observe(in_flight_s=in_flight_s, produced=produced, replica_s=replicas * dur)
    p = model.latency(10.0)
    assert p.mean == pytest.approx(alpha + beta * 10.0, rel=0.02)
    assert p.low <= alpha + beta * 10.0 <= p.high
    r = model.rate(2, 10.0)
    assert r.mean == pytest.approx(2 * 10.0 / (alpha + beta * 10.0), rel=0.02)
    assert not model.observe(in_flight_s=1.0, produced=0, replica_s=1.0)


# ---------------------------------------------------------------------------- deciding


class _Host:
    """A split and a bus the planner is fed from (as the loop does)."""

    def __init__(self, split: RoleSplit) -> None:
        self.split_now = split
        self.bus = EventBus()

    def split(self) -> RoleSplit:
        return self.split_now

    async def move(self, move: RoleMove) -> float:
        self.split_now = move.after
        return 0.0


def _feed(
    planner: RolePlanner,
    host: _Host,
    *,
    intervals: int,
    step_s: float,
    latency_s: float,
    start: float = 0.0,
) -> float:
    """Emit ``intervals`` sync intervals of a run whose steps take ``step_s`` and whose
    samples are in flight ``latency_s`` each (the events the loop and rollouter emit)."""
    wl = planner.workload
    per = wl.steps_per_sync * wl.samples_per_step
    t, step = start, 0
    split = host.split()
    for _ in range(intervals):
        interval = max(
            wl.steps_per_sync * step_s, per * latency_s / (16 * max(1, split.standalone_replicas))
        )
        in_flight = per * latency_s / interval
        host.bus.emit(RolloutEvent(t, round(in_flight), 10_000, "submit"))
        for j in range(wl.steps_per_sync):
            planner.observe_batch([object()] * wl.samples_per_step)
            step += 1
            host.bus.emit(
                SampleEvent(
                    t, "produced", tuple(f"s{step}-{i}" for i in range(wl.samples_per_step))
                )
            )
            t += interval / wl.steps_per_sync
            host.bus.emit(_step_event(step, t, step_s, sync=j == wl.steps_per_sync - 1))
    return t


def _step_event(step: int, t: float, step_s: float, *, sync: bool) -> TrainStepEvent:
    """A trainer step of ``step_s`` seconds ending at ``t`` (``sync``: a weight sync)."""
    return TrainStepEvent(
        step=step,
        time=t,
        timings={"update_actor": step_s, "param_sync": 0.0},
        allocated_s=step_s,
        mq_size=0,
        is_sync_step=sync,
    )


def test_a_training_bound_run_moves_gpus_to_the_trainer() -> None:
    split = RoleSplit(trainer_gpus=8, standalone_replicas=3, gpus_per_replica=8)
    host = _Host(split)
    wl = PlannerWorkload(
        steps_per_sync=4, samples_per_step=16, concurrency_per_replica=16, max_in_flight=96
    )
    planner = RolePlanner(RolePlannerOptions(move_cost_s=10.0), config=wl)
    planner.attach(host.bus, host.split)
    assert isinstance(host, RoleMover)
    _feed(planner, host, intervals=3, step_s=200.0, latency_s=30.0)
    move = planner.decide(split, now=0.0)
    assert move is not None and move.direction == "to_trainer"
    assert move.predicted_gain_s > move.cost_s * 1.2


def test_a_rollout_bound_run_moves_gpus_to_rollout_and_respects_memory() -> None:
    split = RoleSplit(trainer_gpus=24, standalone_replicas=1, gpus_per_replica=8)
    wl = PlannerWorkload(
        steps_per_sync=4, samples_per_step=16, concurrency_per_replica=16, max_in_flight=96
    )
    for floor, expect in ((8, "to_rollout"), (24, None)):
        host = _Host(split)
        planner = RolePlanner(
            RolePlannerOptions(move_cost_s=10.0, trainer_memory_min_gpus=floor), config=wl
        )
        planner.attach(host.bus, host.split)
        _feed(planner, host, intervals=3, step_s=5.0, latency_s=200.0)
        move = planner.decide(split, now=0.0)
        assert (move.direction if move else None) == expect


def test_not_ready_before_enough_intervals_and_no_move_that_cannot_pay() -> None:
    split = RoleSplit(trainer_gpus=8, standalone_replicas=3, gpus_per_replica=8)
    wl = PlannerWorkload(
        steps_per_sync=4, samples_per_step=16, concurrency_per_replica=16, max_in_flight=96
    )
    host = _Host(split)
    planner = RolePlanner(RolePlannerOptions(move_cost_s=1e9), config=wl)
    planner.attach(host.bus, host.split)
    _feed(planner, host, intervals=1, step_s=200.0, latency_s=30.0)
    assert not planner.ready() and planner.decide(split, now=0.0) is None
    _feed(planner, host, intervals=2, step_s=200.0, latency_s=30.0, start=1e4)
    assert planner.ready()
    assert planner.decide(split, now=0.0) is None  # the cost is never paid back


def _feed_all_hybrid(
    planner: RolePlanner, host: _Host, *, intervals: int, step_s: float, rollout_s: float
) -> None:
    """Sync intervals of a split without standalone replicas: the trainer trains its
    steps, then lends its GPUs, whose replicas (16 samples each) roll out the next
    interval's samples in ``rollout_s``."""
    wl = planner.workload
    split = host.split()
    hybrids = split.trainer_gpus // split.gpus_per_replica
    need = wl.steps_per_sync * wl.samples_per_step
    t, step = 0.0, 0
    for _ in range(intervals):
        host.bus.emit(RolloutEvent(t, 0, 10_000, "submit"))
        for j in range(wl.steps_per_sync):
            planner.observe_batch([object()] * wl.samples_per_step)
            step += 1
            last = j == wl.steps_per_sync - 1
            t += step_s
            if last:  # the lent phase, then the sync that closes the interval
                host.bus.emit(ReplicaModeEvent(t, "trainer", "rollout", split.trainer_gpus))
                host.bus.emit(RolloutEvent(t, 16 * hybrids, 10_000, "submit"))
                t += rollout_s
                host.bus.emit(
                    SampleEvent(t, "produced", tuple(f"s{step}-{i}" for i in range(need)))
                )
                host.bus.emit(RolloutEvent(t, 0, 10_000, "submit"))
                host.bus.emit(ReplicaModeEvent(t, "trainer", "train", split.trainer_gpus))
            host.bus.emit(_step_event(step, t, step_s, sync=last))


def test_a_split_without_standalone_replicas_is_predicted_and_judged_finitely() -> None:
    """All GPUs train and lend (``hybrid-24-0``, as ``dynsched plan`` may pick): nothing
    rolls out while the trainer trains. The interval is the fixed point at which the
    hybrid replicas, lent for the rest of it, make what it needs; it was infinite, the
    calibration then 0, and the NaN gain of every candidate passed the cost test, so
    every such run moved a replica to rollout whatever the models said."""
    split = RoleSplit(trainer_gpus=24, standalone_replicas=0, gpus_per_replica=8)
    wl = PlannerWorkload(
        steps_per_sync=4,
        samples_per_step=16,
        concurrency_per_replica=16,
        max_in_flight=96,
        hybrid=True,
    )
    host = _Host(split)
    planner = RolePlanner(RolePlannerOptions(move_cost_s=10.0), config=wl)
    planner.attach(host.bus, host.split)
    # training-bound: 800 s of training, then 40 s of the 3 lent replicas rolling out
    _feed_all_hybrid(planner, host, intervals=3, step_s=200.0, rollout_s=40.0)
    assert planner.ready()
    step = planner.trainer_model.predict(24).mean
    train = planner._train_s(step)
    interval, roll, lat, n = planner._interval(split, step, pessimistic=False)
    assert math.isfinite(interval) and interval > train
    lent = 3 * (1.0 - train / interval)  # 3 hybrid replicas, lent while the trainer waits
    need = wl.steps_per_sync * wl.samples_per_step
    assert roll == pytest.approx(need * lat / (lent * n), rel=1e-9)
    assert roll == pytest.approx(interval, rel=1e-6)
    pred = planner.predict(split)
    assert math.isfinite(pred.seconds) and math.isfinite(pred.high)
    # the one candidate gives the trainer 8 GPUs fewer in a training-bound run: no move
    assert [c.trainer_gpus for c in planner.candidates(split)] == [16]
    assert planner.predict(planner.candidates(split)[0]).seconds > pred.seconds
    assert planner.decide(split, now=0.0) is None


def test_a_split_that_cannot_roll_out_is_moved_to_rollout() -> None:
    """No standalone replica and no hybrid one: the interval never ends (infinite), so
    the planner gives the trainer's GPUs to rollout, whatever the move costs."""
    wl = PlannerWorkload(
        steps_per_sync=4, samples_per_step=16, concurrency_per_replica=16, max_in_flight=96
    )
    host = _Host(RoleSplit(trainer_gpus=24, standalone_replicas=2, gpus_per_replica=8))
    planner = RolePlanner(RolePlannerOptions(move_cost_s=1e6), config=wl)
    planner.attach(host.bus, host.split)
    _feed(planner, host, intervals=3, step_s=200.0, latency_s=50.0)
    assert planner.ready()
    stuck = RoleSplit(trainer_gpus=24, standalone_replicas=0, gpus_per_replica=8)
    assert planner.predict(stuck).seconds == math.inf
    move = planner.decide(stuck, now=0.0)
    assert move is not None and move.direction == "to_rollout"
    assert move.after.standalone_replicas >= 1 and move.predicted_gain_s == math.inf


@settings(max_examples=60, deadline=None)
@given(
    g=st.sampled_from([1, 2, 4, 8]),
    trainer_replicas=st.integers(1, 8),
    standalone=st.integers(0, 8),
    step_s=st.one_of(st.floats(0.1, 5.0), st.floats(5.0, 500.0)),
    latency_s=st.one_of(st.floats(1.0, 500.0), st.floats(500.0, 5000.0)),
    mem_floor=st.integers(1, 64),
    min_standalone=st.integers(1, 3),
    bound=st.one_of(st.none(), st.floats(0.0, 3.0)),
    max_move=st.integers(1, 3),
    T=st.integers(1, 4),
    B=st.integers(1, 32),
    threshold=st.floats(0.0, 2.0),
)
def test_the_planner_never_plans_a_split_violating_memory_or_the_staleness_bound(
    g: int,
    trainer_replicas: int,
    standalone: int,
    step_s: float,
    latency_s: float,
    mem_floor: int,
    min_standalone: int,
    bound: float | None,
    max_move: int,
    T: int,
    B: int,
    threshold: float,
) -> None:
    split = RoleSplit(
        trainer_gpus=trainer_replicas * g, standalone_replicas=standalone, gpus_per_replica=g
    )
    wl = PlannerWorkload(
        steps_per_sync=T,
        samples_per_step=B,
        concurrency_per_replica=16,
        max_in_flight=max(1, round(T * B * (1 + threshold))),
        hybrid=standalone % 2 == 0,
    )
    options = RolePlannerOptions(
        move_cost_s=0.0,
        margin=0.0,
        trainer_memory_min_gpus=mem_floor,
        min_standalone_replicas=min_standalone,
        staleness_bound=bound,
        max_move_replicas=max_move,
    )
    host = _Host(split)
    planner = RolePlanner(options, config=wl)
    planner.attach(host.bus, host.split)
    _feed(planner, host, intervals=3, step_s=step_s, latency_s=latency_s)
    move = planner.decide(split, now=0.0)
    event(f"move {move.direction if move else None}, bound {bound is not None}")
    if move is None:
        return
    after: Any = move.after
    assert after == split.moved(move.direction, move.replicas)
    assert after.total_gpus == split.total_gpus
    assert move.replicas <= max_move
    if move.direction == "to_rollout":
        assert after.trainer_gpus >= max(mem_floor, 1)
    else:
        assert after.standalone_replicas >= min_standalone >= 1
    if bound is not None:
        assert planner.staleness_of(after, planner.predict(after)) <= bound
