"""`StaticFullyAsyncPolicy`: the baseline; the colocated fallback is the framework's."""

from __future__ import annotations

import pytest
from dynsched_core import ConfigError, DynamicScheduleContext, GuardRails
from dynsched_core.testing import contexts
from dynsched_policies import StaticFullyAsyncPolicy
from hypothesis import given
from hypothesis import strategies as st


@given(c=contexts(), g=st.integers(0, 10**6), active=st.booleans())
def test_never_activates_and_never_waits(c: DynamicScheduleContext, g: int, active: bool) -> None:
    p = StaticFullyAsyncPolicy()
    assert p.should_activate_after_step(g, active, c) is False
    assert p.deactivate_wait_samples(c) == 0
    assert p.should_deactivate(g, active, c) is active
    p.update_after_step(g, c)
    assert p.state_dict() == {}


@given(c=contexts(only_hybrid=True), g=st.integers(0, 10**6))
def test_colocated_fallback_comes_from_the_guard_rails(c: DynamicScheduleContext, g: int) -> None:
    """Without standalone replicas the driver activates and buffers the rest of the cycle."""
    p = StaticFullyAsyncPolicy(only_hybrid=True)
    rails = GuardRails(
        min_deactivate_ratio=c.min_deactivate_ratio, max_deactivate_ratio=c.max_deactivate_ratio
    )
    activate, _ = rails.activation(p.should_activate_after_step(g, False, c), c)
    assert activate is not (c.is_last_step or c.producer_finished)
    target, overrides = rails.wait_target(
        p.deactivate_wait_samples(c), c, cycle_remaining=c.step_required_samples
    )
    assert target == c.step_required_samples
    assert "colocated" in [o.rule for o in overrides]
    assert p.request_rebalance(g, c) is False


def test_accepts_shared_config_keys() -> None:
    assert StaticFullyAsyncPolicy(only_hybrid=False, deactivate_ratio=0.3).only_hybrid is False
    with pytest.raises(ConfigError, match=r"deactivate_ratio must be in \[0, 1\]"):
        StaticFullyAsyncPolicy(deactivate_ratio=3.0)
    with pytest.raises(TypeError, match="only_hybrid"):
        StaticFullyAsyncPolicy(only_hybrid="yes")  # type: ignore[arg-type]
