"""Hand-computed examples for every metric definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dynsched_core.events import RolloutEvent
from dynsched_metrics import (
    cluster_resource_utilization,
    correct_placeholder_capacity,
    hybrid_rollout_fraction,
    mq_size,
    rollout_capacity,
    rollout_resource_utilization,
    rollout_resource_utilization_arrays,
    step_generated_samples,
    train_compute_time,
    train_resource_utilization,
)
from dynsched_metrics._definitions import rollout_resource_utilization_reference

BOTH = [rollout_resource_utilization, rollout_resource_utilization_reference]


@pytest.mark.parametrize("fn", BOTH)
def test_rollout_constant_capacity_hand_computed(fn):
    # [0,1): min(4,2)=2 ; [1,3): 4 x 2s ; [3,4): 1 x 1s -> 11 / (4 x 4) = 0.6875
    hist = [(0.0, 2, 4), (1.0, 4, 4), (3.0, 1, 4)]
    assert fn(hist, now=4.0) == pytest.approx(11 / 16)


@pytest.mark.parametrize("fn", BOTH)
def test_rollout_capacity_change_mid_window_uses_each_interval_capacity(fn):
    # hybrid replicas join at t=2: capacity 4 -> 8.
    hist = [(0.0, 4, 4), (2.0, 4, 8), (5.0, 8, 8), (6.0, 3, 8)]
    # used: 2*4 + 3*4 + 1*8 + 2*3 = 34 ; weight: 2*4 + 3*8 + 1*8 + 2*8 = 56
    value = fn(hist, now=8.0)
    assert value == pytest.approx(34 / 56)
    # the single end-of-window capacity (8) would have given 34/64.
    assert not math.isclose(value, 34 / 64)


@pytest.mark.parametrize("fn", BOTH)
def test_rollout_active_above_capacity_is_clamped(fn):
    assert fn([(0.0, 10, 4), (2.0, 0, 4)], now=4.0) == pytest.approx(8 / 16)


@pytest.mark.parametrize("fn", BOTH)
def test_rollout_zero_capacity_intervals_carry_no_weight(fn):
    # [0,2) has capacity 0 (no routable replica): ignored, not counted as idle.
    assert fn([(0.0, 0, 0), (2.0, 3, 4)], now=4.0, seed_placeholder=False) == pytest.approx(6 / 8)
    assert fn([(0.0, 5, 0), (2.0, 5, 0)], now=4.0) == 0.0
    assert fn([], now=3.0) == 0.0
    assert fn([(1.0, 2, 4)]) == 0.0  # no time span


@pytest.mark.parametrize("fn", BOTH)
def test_rollout_window_closed_at_now_counts_trailing_idle(fn):
    hist = [(0.0, 4, 4), (2.0, 0, 4)]
    assert fn(hist) == pytest.approx(1.0)  # window ends at the last point
    assert fn(hist, now=4.0) == pytest.approx(0.5)  # 2s of trailing idle capacity


@pytest.mark.parametrize("fn", BOTH)
def test_rollout_placeholder_seed_capacity_is_corrected(fn):
    events = [
        RolloutEvent(0.0, 0, 0, "seed"),  # recorded before the capacity is known
        RolloutEvent(2.0, 4, 4, "submit"),
        RolloutEvent(6.0, 3, 4, "complete"),
    ]
    # seed interval gets capacity 4: used 0 + 16 + 6 = 22 ; weight 8 + 16 + 8 = 32
    assert fn(events, now=8.0) == pytest.approx(22 / 32)
    # without the correction the start-up interval would silently drop out (22/24)
    assert fn(events, now=8.0, seed_placeholder=False) == pytest.approx(22 / 24)


def test_correct_placeholder_capacity():
    pts = [(0.0, 0, 0), (1.0, 2, 6), (2.0, 1, 0)]
    assert correct_placeholder_capacity(pts) == [(0.0, 0, 6), (1.0, 2, 6), (2.0, 1, 0)]
    assert correct_placeholder_capacity(pts, seed_placeholder=False) == pts
    assert correct_placeholder_capacity([(0.0, 0, 0)]) == [(0.0, 0, 0)]  # not known yet
    assert correct_placeholder_capacity([(0.0, 0, 3), (1.0, 0, 6)])[0] == (0.0, 0, 3)


def test_arrays_path_matches_and_validates():
    t = np.array([0.0, 2.0, 5.0, 6.0])
    a = np.array([4, 4, 8, 3])
    c = np.array([4, 8, 8, 8])
    assert rollout_resource_utilization_arrays(t, a, c, 8.0) == pytest.approx(34 / 56)
    with pytest.raises(ValueError, match="non-decreasing"):
        rollout_resource_utilization_arrays([0.0, 2.0, 1.0], [1, 1, 1], [1, 1, 1])
    with pytest.raises(ValueError, match="equal length"):
        rollout_resource_utilization_arrays([0.0, 1.0], [1], [1, 1])
    with pytest.raises(ValueError, match="now"):
        rollout_resource_utilization_arrays([0.0, 2.0], [1, 1], [1, 1], now=1.0)
    with pytest.raises(ValueError, match=">= 0"):
        rollout_resource_utilization_reference([(0.0, -1, 1), (1.0, 0, 1)])
    with pytest.raises(ValueError, match="non-decreasing"):
        rollout_resource_utilization_reference([(1.0, 1, 1), (0.0, 0, 1)])


def test_rollout_capacity_formula():
    assert rollout_capacity(3, 4, 100) == 12
    assert rollout_capacity(30, 4, 100) == 100
    assert rollout_capacity(0, 4, 100) == 0
    with pytest.raises(ValueError, match="servers"):
        rollout_capacity(-1, 4, 100)


def test_train_utilization_from_summed_totals():
    step1 = {
        "reward": 1.0,
        "old_log_prob": 2.0,
        "ref": 0.5,
        "update_actor": 3.0,
        "wait_for_enough_samples": 4.0,
        "param_sync": 1.0,
        "step": 12.0,
    }
    step2 = {"update_actor": 5.0, "adv": 0.5}  # values / update_critic missing -> 0
    c1, c2 = train_compute_time(step1), train_compute_time(step2)
    assert (c1, c2) == (6.5, 5.5)  # wait and param_sync are not compute
    alloc1, alloc2 = 12.0, 8.0
    u = train_resource_utilization(c1 + c2, alloc1 + alloc2)
    assert u == pytest.approx(12 / 20)
    mean_of_ratios = (c1 / alloc1 + c2 / alloc2) / 2
    assert not math.isclose(u, mean_of_ratios)
    assert train_resource_utilization(3.0, 0.0) == 0.0
    assert train_resource_utilization(5.0, 4.0) == 1.0  # clipped, raw sums stay visible
    all_keys = dict.fromkeys(
        ["reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor"], 1.0
    )
    assert train_compute_time(all_keys) == 7.0


def test_hybrid_rollout_fraction():
    assert hybrid_rollout_fraction(4.0, 20.0) == pytest.approx(0.2)
    assert hybrid_rollout_fraction(30.0, 20.0) == 1.0
    assert hybrid_rollout_fraction(-1.0, 20.0) == 0.0
    assert hybrid_rollout_fraction(3.0, 0.0) == 0.0


def test_cluster_utilization_hand_computed():
    # a=16 hybrid-capable trainer GPUs, b=16 standalone, x = 4/20 = 0.2
    u = cluster_resource_utilization(0.6, 0.8, 0.2, 16, 16)
    assert u == pytest.approx(((0.8 * 16 * 0.6) + (0.2 * 16 + 16) * 0.8) / 32)
    assert u == pytest.approx(0.72)
    # x = 0: hybrid GPUs all training
    assert cluster_resource_utilization(0.5, 1.0, 0.0, 8, 24) == pytest.approx((8 * 0.5 + 24) / 32)
    # x = 1: everyone on rollout
    assert cluster_resource_utilization(0.1, 0.7, 1.0, 8, 24) == pytest.approx(0.7)
    assert cluster_resource_utilization(0.5, 0.5, 0.0, 0, 0) == 0.0
    with pytest.raises(ValueError, match="x must"):
        cluster_resource_utilization(0.5, 0.5, 1.5, 1, 1)
    with pytest.raises(ValueError, match="hybrid_gpus"):
        cluster_resource_utilization(0.5, 0.5, 0.5, -1, 1)


def test_mq_size_and_step_generated_samples():
    assert mq_size([5, 9, 3]) == 3
    assert mq_size([]) == 0
    window = [
        RolloutEvent(0.0, 0, 4, "reset"),
        RolloutEvent(1.0, 1, 4, "submit"),
        RolloutEvent(2.0, 0, 4, "complete"),
        RolloutEvent(2.5, 1, 4, "submit"),
        RolloutEvent(3.0, 0, 4, "complete"),
        RolloutEvent(3.5, 0, 8, "capacity"),
    ]
    assert step_generated_samples(window) == 2
