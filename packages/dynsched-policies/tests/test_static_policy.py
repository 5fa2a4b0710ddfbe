"""`StaticFullyAsyncPolicy`: the baseline and its colocated fallback."""

from __future__ import annotations

import pytest
from dynsched_core import ConfigError, DynamicScheduleContext
from dynsched_core.testing import contexts
from dynsched_policies import StaticFullyAsyncPolicy
from hypothesis import given
from hypothesis import strategies as st


@given(c=contexts(only_hybrid=False), g=st.integers(0, 10**6), active=st.booleans())
def test_with_standalone_replicas_never_activates(
    c: DynamicScheduleContext, g: int, active: bool
) -> None:
    p = StaticFullyAsyncPolicy()
    assert p.should_activate_after_step(g, active, c) is False
    assert p.deactivate_wait_samples(c) == 0
    assert p.should_deactivate(g, active, c) is active
    p.update_after_step(g, c)
    assert p.state_dict() == {}


@given(c=contexts(only_hybrid=True), g=st.integers(0, 10**6), active=st.booleans())
def test_colocated_context_activates_and_buffers_the_whole_cycle(
    c: DynamicScheduleContext, g: int, active: bool
) -> None:
    p = StaticFullyAsyncPolicy()
    assert p.should_activate_after_step(g, active, c) is True
    assert p.deactivate_wait_samples(c) == c.step_required_samples
    assert p.should_deactivate(g, active, c) is active


def test_only_hybrid_flag_runs_colocated_schedule_on_any_context() -> None:
    p = StaticFullyAsyncPolicy(only_hybrid=True)
    c = DynamicScheduleContext(
        required_samples=8, trigger_parameter_sync_step=3, total_generated_samples=1000
    )
    assert p.should_activate_after_step(1, False, c) is True
    assert p.deactivate_wait_samples(c) == 24
    assert p.request_rebalance(1, c) is False


def test_accepts_shared_config_keys() -> None:
    assert StaticFullyAsyncPolicy(only_hybrid=False, deactivate_ratio=0.3).only_hybrid is False
    with pytest.raises(ConfigError, match=r"deactivate_ratio must be in \[0, 1\]"):
        StaticFullyAsyncPolicy(deactivate_ratio=3.0)
    with pytest.raises(TypeError, match="only_hybrid"):
        StaticFullyAsyncPolicy(only_hybrid="yes")  # type: ignore[arg-type]
