"""The published experiment: ordering, calibrated ratios and queue behaviour, full length."""

from __future__ import annotations

import pytest
from dynsched_sim._sim import RunResult

PUBLISHED_16_16 = 6.546 / 5.4  # 1.21
PUBLISHED_8_24 = 6.379 / 5.4  # 1.18


def test_published_ordering(seed_runs: dict[str, RunResult]) -> None:
    dyn = seed_runs["dynamic-16-16"].wall_clock_s
    s824 = seed_runs["static-8-24"].wall_clock_s
    s1616 = seed_runs["static-16-16"].wall_clock_s
    assert dyn < s824 < s1616


def test_calibrated_ratios_within_three_points(seed_runs: dict[str, RunResult]) -> None:
    dyn = seed_runs["dynamic-16-16"].wall_clock_s
    assert seed_runs["static-16-16"].wall_clock_s / dyn == pytest.approx(1.21, abs=0.03)
    assert seed_runs["static-8-24"].wall_clock_s / dyn == pytest.approx(1.18, abs=0.03)
    assert pytest.approx(1.21, abs=0.005) == PUBLISHED_16_16
    assert pytest.approx(1.18, abs=0.005) == PUBLISHED_8_24


def test_absolute_wall_clock_close_to_published(seed_runs: dict[str, RunResult]) -> None:
    for name, hours in (("static-16-16", 6.546), ("static-8-24", 6.379), ("dynamic-16-16", 5.4)):
        assert seed_runs[name].wall_clock_s / 3600 == pytest.approx(hours, rel=0.03)


def test_published_queue_behaviour(seed_runs: dict[str, RunResult]) -> None:
    mq = {k: r.summary["mq_size_mean"] for k, r in seed_runs.items()}
    cap = seed_runs["static-16-16"].summary["queue_capacity"]
    # 16+16 is production-bound: the queue is drained to near zero
    assert mq["static-16-16"] <= 0.1 * cap
    # 8+24 is consumption-bound: samples back up and the queue sits at its capacity
    assert mq["static-8-24"] >= 0.8 * cap
    # dynamic stays in between
    assert mq["static-16-16"] < mq["dynamic-16-16"] < mq["static-8-24"]


def test_dynamic_switches_and_static_never_does(seed_runs: dict[str, RunResult]) -> None:
    assert seed_runs["dynamic-16-16"].summary["activations"] > 0
    assert seed_runs["dynamic-16-16"].summary["aborted_requests"] > 0
    for name in ("static-16-16", "static-8-24"):
        assert seed_runs[name].summary["switches"] == 0
        assert seed_runs[name].policy == "static_fully_async"


def test_conservation_on_the_published_runs(seed_runs: dict[str, RunResult]) -> None:
    for r in seed_runs.values():
        assert r.conservation and all(r.conservation.values()), r.conservation


def test_efficiency_at_most_one(seed_runs: dict[str, RunResult]) -> None:
    for r in seed_runs.values():
        assert 0.0 < r.efficiency <= 1.0
