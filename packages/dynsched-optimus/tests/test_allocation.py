"""Greedy allocation: properties (hypothesis), tie-breaks, fast path equal to the reference."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from dynsched_optimus import (
    AllocationJob,
    OptimusError,
    PSSpeedModel,
    StepTimeModel,
    allocate,
    dominant_share,
)
from dynsched_optimus._allocation import _time_fn, allocate_reference
from hypothesis import given, settings
from hypothesis import strategies as st

SYNC = PSSpeedModel(mode="sync", theta=(0.002, 0.1, 0.2, 0.01, 0.01), global_batch=128)
ASYNC = PSSpeedModel(mode="async", theta=(0.3, 0.2, 0.01, 0.01))


@st.composite
def speed_models(draw):
    mode = draw(st.sampled_from(["async", "sync"]))
    job = StepTimeModel(
        mode=mode,
        batch=draw(st.sampled_from([32.0, 64.0, 256.0])),
        t_forward=draw(st.sampled_from([1e-4, 1e-3, 4e-3])),
        t_back=draw(st.sampled_from([0.02, 0.1, 0.4])),
        model_size=draw(st.sampled_from([10.0, 100.0, 500.0])),
        t_update=draw(st.sampled_from([1e-3, 1e-2])),
        delta=draw(st.sampled_from([1e-3, 5e-3, 2e-2])),
        delta_ps=draw(st.sampled_from([1e-3, 5e-3, 2e-2])),
    )
    return job.as_speed_model()


demand = st.tuples(
    st.integers(1, 4).map(float), st.integers(0, 6).map(float), st.integers(0, 1).map(float)
)


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 10))
    models = draw(st.lists(speed_models(), min_size=1, max_size=4))
    jobs = []
    for i in range(n):
        jobs.append(
            AllocationJob(
                job_id=f"job{draw(st.integers(0, 99)):02d}-{i}",
                remaining_steps=draw(st.sampled_from([-1.0, 1000.0, 5000.0, 20000.0])),
                speed=draw(st.sampled_from(models)),
                ps_demand=draw(demand),
                worker_demand=draw(demand),
                damped=draw(st.booleans()),
                max_ps=draw(st.one_of(st.none(), st.integers(1, 4))),
                max_workers=draw(st.one_of(st.none(), st.integers(1, 8))),
            )
        )
    cap = (
        float(draw(st.integers(0, 80))),
        float(draw(st.integers(0, 120))),
        float(draw(st.integers(0, 12))),
    )
    return jobs, cap


def _used(jobs, tasks, nr):
    used = [0.0] * nr
    for j in jobs:
        p, w = tasks[j.job_id]
        for r in range(nr):
            used[r] += p * j.ps_demand[r] + w * j.worker_demand[r]
    return used


def _fits(used, d, cap):
    return all(u + x <= c + 1e-9 * c for u, x, c in zip(used, d, cap, strict=True))


@settings(deadline=None)
@given(scenarios())
def test_fast_path_equals_reference(sc) -> None:
    jobs, cap = sc
    ref = allocate_reference(jobs, cap)
    fast = allocate(jobs, cap)
    assert dict(fast.tasks) == dict(ref.tasks)
    assert fast.used == pytest.approx(ref.used)
    # the heap fallback of the fast path (after a bounded number of rounds) agrees too
    assert dict(allocate(jobs, cap, max_rounds=1).tasks) == dict(ref.tasks)


@settings(deadline=None)
@given(scenarios())
def test_capacity_starters_order_and_stop_rule(sc) -> None:
    jobs, cap = sc
    res = allocate(jobs, cap)
    used = _used(jobs, res.tasks, len(cap))
    # never exceeds capacity in any resource
    for u, c in zip(used, cap, strict=True):
        assert u <= c + 1e-9 * max(c, 1.0)
    for j in jobs:
        p, w = res.tasks[j.job_id]
        if j.remaining_steps <= 0:
            assert (p, w) == (0, 0)
            continue
        bundle = tuple(a + b for a, b in zip(j.ps_demand, j.worker_demand, strict=True))
        if (p, w) == (0, 0):
            # every job that could still get 1 PS + 1 worker got it
            assert not _fits(used, bundle, cap)
        else:
            assert p >= 1 and w >= 1
            assert j.max_ps is None or p <= j.max_ps
            assert j.max_workers is None or w <= j.max_workers
            # the loop stopped only because nothing fits or the gains are <= 0
            t = _time_fn(j)
            damp = 0.95 if j.damped else 1.0
            gw = (t(p, w) - t(p, w + 1)) / dominant_share(j.worker_demand, cap) * damp
            gp = (t(p, w) - t(p + 1, w)) / dominant_share(j.ps_demand, cap) * damp
            if j.max_workers is None or w < j.max_workers:
                assert gw <= 0 or not _fits(used, j.worker_demand, cap)
            if j.max_ps is None or p < j.max_ps:
                assert gp <= 0 or not _fits(used, j.ps_demand, cap)
    # the result does not depend on the order the jobs are listed in
    shuffled = list(jobs)
    random.Random(len(jobs)).shuffle(shuffled)
    assert dict(allocate(shuffled, cap).tasks) == dict(res.tasks)
    assert dict(allocate_reference(list(reversed(jobs)), cap).tasks) == dict(res.tasks)


def test_ties_go_to_the_smaller_job_id() -> None:
    d = (1.0, 1.0)
    jobs = [
        AllocationJob("b", 1000, SYNC, d, d),
        AllocationJob("a", 1000, SYNC, d, d),
    ]
    res = allocate(jobs, (5.0, 5.0))  # room for both starters and one more task
    assert res.tasks["a"][0] + res.tasks["a"][1] == 3
    assert res.tasks["b"] == (1, 1)
    assert dict(allocate(list(reversed(jobs)), (5.0, 5.0)).tasks) == dict(res.tasks)


def test_candidate_that_does_not_fit_is_skipped_not_the_end() -> None:
    # job "big" wants more PS (sync, communication bound) but a PS needs 10 cpu; the loop
    # must skip it and keep giving workers
    heavy_ps = PSSpeedModel(mode="sync", theta=(0.0, 0.01, 5.0, 0.0, 0.0), global_batch=64)
    jobs = [
        AllocationJob("big", 1e4, heavy_ps, ps_demand=(10.0, 1.0), worker_demand=(1.0, 1.0)),
        AllocationJob("small", 1e4, SYNC, ps_demand=(1.0, 1.0), worker_demand=(1.0, 1.0)),
    ]
    res = allocate(jobs, (16.0, 100.0))
    ref = allocate_reference(jobs, (16.0, 100.0))
    assert dict(res.tasks) == dict(ref.tasks)
    assert res.tasks["big"][0] == 1  # a second PS never fits after the starters
    assert sum(res.used[:1]) > 12  # but the remaining cpu went to workers


def test_damping_lowers_priority_of_few_point_models() -> None:
    d = (1.0,)
    base = [
        AllocationJob("x", 1000, SYNC, d, d, damped=True),
        AllocationJob("y", 1000, SYNC, d, d),
    ]
    res = allocate(base, (5.0,))
    assert res.tasks["y"] > res.tasks["x"]  # equal gains: the damped one loses the tie
    undamped = allocate(base, (5.0,), damping=1.0)
    assert sum(undamped.tasks["x"]) == 3  # smaller job id wins without damping


def test_generic_speed_callable_uses_the_reference_path() -> None:
    def speed(p: int, w: int) -> float:
        return min(w, 4 * p) / (1 + 0.01 * w)

    jobs = [AllocationJob("g", 1e3, speed, (1.0,), (1.0,))]
    res = allocate(jobs, (20.0,))
    assert res.method == "fast"
    assert dict(res.tasks) == dict(allocate_reference(jobs, (20.0,)).tasks)
    p, w = res.tasks["g"]
    assert w <= 4 * p + 4


def test_large_random_instance_matches_reference() -> None:
    rng = np.random.default_rng(3)
    jobs = []
    for i in range(300):
        job = StepTimeModel.random(rng, "sync" if i % 2 else "async")
        jobs.append(
            AllocationJob(
                f"j{i}",
                float(rng.uniform(1e3, 1e5)),
                job.as_speed_model(),
                ps_demand=(float(rng.integers(1, 5)), float(rng.integers(2, 9)), 0.0),
                worker_demand=(float(rng.integers(1, 5)), float(rng.integers(2, 9)), 1.0),
                damped=bool(rng.random() < 0.3),
            )
        )
    cap = (3000.0, 9000.0, 700.0)
    fast = allocate(jobs, cap)
    assert dict(fast.tasks) == dict(allocate_reference(jobs, cap).tasks)
    assert fast.total_tasks > 600


def test_invalid_input_is_reported() -> None:
    with pytest.raises(OptimusError, match="positive entry"):
        AllocationJob("z", 10, SYNC, (0.0, 0.0), (1.0, 1.0))
    with pytest.raises(OptimusError, match="duplicate job_id"):
        allocate([AllocationJob("a", 1, SYNC, (1,), (1,))] * 2, (4.0,))
    with pytest.raises(OptimusError, match="resources"):
        allocate([AllocationJob("a", 1, SYNC, (1, 1), (1, 1))], (4.0,))
    with pytest.raises(OptimusError, match="damping"):
        allocate([], (1.0,), damping=0.0)
    with pytest.raises(OptimusError, match="method"):
        allocate([], (1.0,), method="magic")  # type: ignore[arg-type]
    assert math.isclose(dominant_share((1.0, 4.0, 1.0), (10.0, 8.0, 0.0)), 0.5)
