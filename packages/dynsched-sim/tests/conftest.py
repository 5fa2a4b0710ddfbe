"""Shared fixtures: the full seed-qwen35 comparison runs once per session (a few seconds)."""

from __future__ import annotations

import pytest
from dynsched_sim import load_scenario
from dynsched_sim._report import compare
from dynsched_sim._sim import RunResult


@pytest.fixture(scope="session")
def seed_runs() -> dict[str, RunResult]:
    sc = load_scenario("seed-qwen35")
    return {r.configuration: r for r in compare(sc, ["default"])}
