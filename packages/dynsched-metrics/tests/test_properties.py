"""Hypothesis properties of the metric definitions."""

from __future__ import annotations

import math

from dynsched_metrics import (
    cluster_resource_utilization,
    hybrid_rollout_fraction,
    rollout_resource_utilization,
    train_resource_utilization,
)
from dynsched_metrics._definitions import rollout_resource_utilization_reference
from hypothesis import assume, given
from hypothesis import strategies as st

counts = st.integers(min_value=0, max_value=64)
gaps = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
gpus = st.integers(min_value=0, max_value=512)


@st.composite
def histories(draw, capacity=None, min_size=1):
    n = draw(st.integers(min_value=min_size, max_value=40))
    t = draw(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False))
    points = []
    for _ in range(n):
        cap = capacity if capacity is not None else draw(counts)
        points.append((t, draw(counts), cap))
        t += draw(gaps)
    now = t + draw(gaps)
    return points, now


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@given(histories(), st.booleans())
def test_vectorised_equals_reference(data, seed):
    points, now = data
    fast = rollout_resource_utilization(points, now, seed_placeholder=seed)
    ref = rollout_resource_utilization_reference(points, now, seed_placeholder=seed)
    assert close(fast, ref)
    assert close(
        rollout_resource_utilization(points, seed_placeholder=seed),
        rollout_resource_utilization_reference(points, seed_placeholder=seed),
    )


@given(histories(), st.booleans())
def test_rollout_utilization_in_unit_interval(data, seed):
    points, now = data
    for fn in (rollout_resource_utilization, rollout_resource_utilization_reference):
        assert 0.0 <= fn(points, now, seed_placeholder=seed) <= 1.0


@given(histories(min_size=1), st.data())
def test_splitting_an_interval_changes_nothing(data, draw):
    points, now = data
    ends = [p[0] for p in points[1:]] + [now]
    k = draw.draw(st.integers(min_value=0, max_value=len(points) - 1))
    t0, active, cap = points[k]
    assume(ends[k] > t0)
    frac = draw.draw(st.floats(min_value=0.0, max_value=1.0))
    mid = t0 + frac * (ends[k] - t0)
    mid = min(max(mid, t0), ends[k])
    split = [*points[: k + 1], (mid, active, cap), *points[k + 1 :]]
    for fn in (rollout_resource_utilization, rollout_resource_utilization_reference):
        assert close(
            fn(points, now, seed_placeholder=False), fn(split, now, seed_placeholder=False)
        )


@given(histories(capacity=1), st.integers(min_value=1, max_value=64))
def test_constant_capacity_is_time_average_of_min_active_cap_over_cap(data, cap):
    points, now = data
    points = [(t, a, cap) for t, a, _ in points]
    ends = [p[0] for p in points[1:]] + [now]
    span = now - points[0][0]
    assume(span > 0)
    avg = sum((e - t) * min(a, cap) / cap for (t, a, _), e in zip(points, ends, strict=True)) / span
    for fn in (rollout_resource_utilization, rollout_resource_utilization_reference):
        assert math.isclose(fn(points, now), avg, rel_tol=1e-9, abs_tol=1e-9)


@given(
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
)
def test_train_utilization_in_unit_interval(compute_s, allocated_s):
    assert 0.0 <= train_resource_utilization(compute_s, allocated_s) <= 1.0


@given(unit, unit, unit, gpus, gpus)
def test_cluster_utilization_in_unit_interval(u_train, u_rollout, x, a, b):
    assert 0.0 <= cluster_resource_utilization(u_train, u_rollout, x, a, b) <= 1.0


@given(unit, unit, gpus, gpus)
def test_cluster_utilization_with_x_zero_weights_train_by_hybrid_gpus(u_train, u_rollout, a, b):
    assume(a + b > 0)
    u = cluster_resource_utilization(u_train, u_rollout, 0.0, a, b)
    assert math.isclose(u, (a * u_train + b * u_rollout) / (a + b), rel_tol=1e-12, abs_tol=1e-12)
    if b == 0:  # trainer-only cluster: exactly U_train
        assert math.isclose(u, u_train, rel_tol=1e-12, abs_tol=1e-12)
    if a > 0 and b > 0 and u_train != u_rollout:  # strictly between the two
        assert (
            min(u_train, u_rollout) < u < max(u_train, u_rollout)
            or math.isclose(u, u_train, abs_tol=1e-12)
            or math.isclose(u, u_rollout, abs_tol=1e-12)
        )


@given(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
)
def test_x_in_unit_interval(wait_s, step_s):
    assert 0.0 <= hybrid_rollout_fraction(wait_s, step_s) <= 1.0
