"""One run builds and validates the core's schedule config once."""

from __future__ import annotations

from typing import Any

import pytest
from dynsched_core import DynamicScheduleConfig
from dynsched_sim import load_scenario, run_configuration


def test_a_run_builds_the_schedule_config_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    original = DynamicScheduleConfig.__attrs_post_init__

    def counting(self: DynamicScheduleConfig) -> None:
        built.append(self)
        original(self)

    monkeypatch.setattr(DynamicScheduleConfig, "__attrs_post_init__", counting)
    scenario = load_scenario("seed-qwen35").with_steps(4)
    built.clear()
    result = run_configuration(scenario, "dynamic-16-16", "fixed_ratio")
    assert len(built) == 1
    assert built[0].dynamic_schedule_policy == "fixed_ratio" == result.policy
