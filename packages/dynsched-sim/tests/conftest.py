"""Shared fixtures: the full seed-qwen35 comparison over its 5 workload seeds runs once per
session (15 runs, under a minute on one core)."""

from __future__ import annotations

import pytest
from dynsched_sim import Aggregate, aggregate, load_scenario
from dynsched_sim._report import compare
from dynsched_sim._sim import RunResult


@pytest.fixture(scope="session")
def seed_comparison() -> list[RunResult]:
    return compare(load_scenario("seed-qwen35"), ["default"])


@pytest.fixture(scope="session")
def seed_runs(seed_comparison: list[RunResult]) -> dict[str, RunResult]:
    """The first seed's run of each configuration."""
    first = min(r.seed for r in seed_comparison)
    return {r.configuration: r for r in seed_comparison if r.seed == first}


@pytest.fixture(scope="session")
def seed_aggregate(seed_comparison: list[RunResult]) -> dict[str, Aggregate]:
    """Mean and spread over the seeds, per configuration."""
    aggs = aggregate(load_scenario("seed-qwen35"), seed_comparison)
    return {a.configuration: a for a in aggs}
