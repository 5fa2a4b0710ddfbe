"""`FixedRatioDynamicSchedulePolicy`: fixed ratio, pure gap test."""

from __future__ import annotations

import pytest
from dynsched_core import ConfigError, DynamicScheduleContext, GuardRails
from dynsched_core.testing import contexts
from dynsched_policies import FixedRatioDynamicSchedulePolicy
from hypothesis import given
from hypothesis import strategies as st


def ctx(
    surplus: int, *, required: int = 10, sync_steps: int = 4, **kw: object
) -> DynamicScheduleContext:
    return DynamicScheduleContext(
        required_samples=required,
        trigger_parameter_sync_step=sync_steps,
        total_generated_samples=100 + surplus,
        expected_samples=100,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("surplus", "activate"), [(-5, True), (0, True), (11, True), (12, False), (13, False)]
)
def test_pure_gap_test(surplus: int, activate: bool) -> None:
    # ratio 0.3 * 40 = 12: activate iff surplus < 12
    p = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.3)
    assert p.should_activate_after_step(1, False, ctx(surplus)) is activate


def test_gate_ignores_timings_and_switch_cost() -> None:
    p = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.5)
    # gap of one sample that takes 1 ms: default's gate would refuse, fixed_ratio activates
    c = ctx(19, step_wait_times=(0.001,), step_wait_samples=(1,), last_activate_duration_s=100.0)
    assert p.should_activate_after_step(1, False, c) is True


@given(c=contexts(only_hybrid=False), g=st.integers(0, 10**6))
def test_update_after_step_does_nothing(c: DynamicScheduleContext, g: int) -> None:
    p = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.45)
    before = p.should_activate_after_step(g, False, c), p.deactivate_wait_samples(c)
    p.update_after_step(g, c)
    assert p.deactivate_ratio == 0.45
    assert p.state_dict() == {}
    assert (p.should_activate_after_step(g, False, c), p.deactivate_wait_samples(c)) == before


def test_deactivation_like_default() -> None:
    p = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.25)
    assert p.should_deactivate(1, True, ctx(0)) is True
    assert p.should_deactivate(1, False, ctx(0)) is False
    assert p.deactivate_wait_samples(ctx(0)) == 10
    assert p.request_rebalance(1, ctx(0)) is True


def test_colocated_schedule_is_the_guard_rails_not_the_policy() -> None:
    p = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.25, only_hybrid=True)
    assert p.only_hybrid and p.deactivate_ratio == 0.25  # verl's flag, kept for compatibility
    c = ctx(10_000, only_hybrid=True)
    assert p.should_activate_after_step(1, False, c) is False
    assert GuardRails().activation(False, c) == (True, GuardRails().activation(False, c)[1])
    assert GuardRails().activation(False, c)[1][0].rule == "colocated"


def test_state_is_empty_and_load_refuses_keys() -> None:
    p = FixedRatioDynamicSchedulePolicy()
    p.load_state_dict({})
    with pytest.raises(ValueError, match="deactivate_ratio"):
        p.load_state_dict({"deactivate_ratio": 0.9})


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"deactivate_ratio": 1.01}, r"deactivate_ratio must be in \[0, 1\]"),
        ({"deactivate_ratio": -0.01}, r"deactivate_ratio must be in \[0, 1\]"),
    ],
)
def test_bounds_validated(kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        FixedRatioDynamicSchedulePolicy(**kwargs)
