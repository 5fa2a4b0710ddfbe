"""The conformance kit itself: it accepts good policies and names what a bad one breaks."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

import pytest
from dynsched_core import DynamicScheduleContext, DynamicSchedulePolicyBase, GuardRails
from dynsched_core.testing import (
    POLICY_PROPERTIES,
    PolicyConformanceError,
    check_policy,
    colocated_contexts,
    contexts,
    drive_steps,
    step_sequences,
)
from hypothesis import given


class Good(DynamicSchedulePolicyBase):
    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return ctx.step_required_samples if ctx.only_hybrid else ctx.step_required_samples // 3

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return ctx.only_hybrid or ctx.surplus_samples < ctx.step_required_samples // 3


class DividesByWaits(Good):
    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
        return ctx.total_wait_time / ctx.total_wait_samples > 1.0


class ReturnsInt(Good):
    def should_deactivate(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
        return int(is_hybrid_active)


class ReturnsFloatThreshold(Good):
    def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
        return 0.5 * ctx.step_required_samples


class WaitsTooLong(Good):
    def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
        return 2 * ctx.step_required_samples + ctx.buffer_samples + 1


class BadRebalance(Good):
    def request_rebalance(self, global_steps, ctx):  # type: ignore[no-untyped-def]
        return "yes"


_counter = itertools.count()


class Nondeterministic(Good):
    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
        return ctx.only_hybrid or next(_counter) % 2 == 0


class ForgetsState(Good):
    """Learns a counter but does not checkpoint it."""

    def __init__(self) -> None:
        self.n = 0

    def update_after_step(self, global_steps, ctx):  # type: ignore[no-untyped-def]
        self.n += 1

    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
        return ctx.only_hybrid or self.n % 2 == 0


class LiveState(Good):
    """Returns its internal list from state_dict."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def update_after_step(self, global_steps, ctx):  # type: ignore[no-untyped-def]
        self.seen.append(global_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seen = list(state["seen"])


class RefusesOwnState(Good):
    def state_dict(self) -> dict[str, Any]:
        return {"version": 1}


class PublishedStatic(DynamicSchedulePolicyBase):
    """The published static_fully_async: deactivates without waiting, never activates."""

    def __init__(self, only_hybrid: bool = False) -> None:
        self.only_hybrid = only_hybrid

    def should_deactivate(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
        return 0

    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):  # type: ignore[no-untyped-def]
        return False


class ColocatedHalfWait(Good):
    """Activates when colocated but gives the GPUs back after half a cycle."""

    def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
        return ctx.step_required_samples // 2 if ctx.only_hybrid else 0


class NotAPolicy:
    pass


@pytest.mark.parametrize(
    ("factory", "prop"),
    [
        (DividesByWaits, "no_raise"),
        (ReturnsInt, "return_types"),
        (ReturnsFloatThreshold, "return_types"),
        (WaitsTooLong, "wait_threshold_bounds"),
        (BadRebalance, "return_types"),
        (Nondeterministic, "deterministic"),
        (ForgetsState, "state_dict_round_trip"),
        (LiveState, "state_dict_round_trip"),
        (RefusesOwnState, "state_dict_round_trip"),
        (NotAPolicy, "construct"),
    ],
)
def test_violations_are_reported_by_property_name(factory: Any, prop: str) -> None:
    with pytest.raises(AssertionError) as err:
        check_policy(factory, max_examples=30, shrink=False)
    assert isinstance(err.value, PolicyConformanceError)
    assert err.value.property_name == prop
    assert f"property {prop!r} failed" in str(err.value)
    assert factory.__qualname__ in str(err.value)
    assert prop in POLICY_PROPERTIES


def test_good_policy_passes() -> None:
    check_policy(Good, max_examples=20)


class RaisesWhenColocated(Good):
    def __init__(self, only_hybrid: bool = False) -> None:
        self.only_hybrid = only_hybrid

    def deactivate_wait_samples(self, ctx):  # type: ignore[no-untyped-def]
        if self.only_hybrid:
            raise RuntimeError("not built for colocated runs")
        return super().deactivate_wait_samples(ctx)


def test_colocated_factory_is_checked_too() -> None:
    check_policy(RaisesWhenColocated, max_examples=10)
    with pytest.raises(PolicyConformanceError, match=re.escape("[colocated_factory]")):
        check_policy(
            RaisesWhenColocated,
            colocated_factory=lambda: RaisesWhenColocated(only_hybrid=True),
            max_examples=20,
            shrink=False,
        )


@pytest.mark.parametrize("factory", [PublishedStatic, ColocatedHalfWait])
def test_policies_that_would_deadlock_alone_are_protected_by_the_guard_rails(
    factory: Any,
) -> None:
    """The published static policy never activates; colocated, the framework does it."""
    check_policy(factory, colocated_factory=factory, max_examples=20)


def test_without_the_colocated_guard_rail_the_deadlock_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The property can fail: with the colocated rule removed, the published policy deadlocks."""

    def policy_decides(self: GuardRails, wants: bool, ctx: Any) -> tuple[bool, tuple[()]]:
        return wants, ()

    monkeypatch.setattr(GuardRails, "activation", policy_decides)
    with pytest.raises(PolicyConformanceError) as err:
        check_policy(PublishedStatic, name="published-static", max_examples=20)
    assert err.value.property_name == "only_hybrid_no_deadlock"
    assert "hybrid replicas are asleep" in str(err.value)
    assert "check_policy(published-static)" in str(err.value)


# -- the strategies ---------------------------------------------------------------
@given(c=contexts())
def test_contexts_are_consistent(c: DynamicScheduleContext) -> None:
    assert len(c.step_wait_times) == len(c.step_wait_samples)
    assert c.step_required_samples >= 1
    if c.only_hybrid:
        assert c.num_standalone_replicas == 0 and c.num_hybrid_replicas >= 1


@given(c=colocated_contexts())
def test_colocated_contexts(c: DynamicScheduleContext) -> None:
    assert c.only_hybrid


@given(steps=step_sequences(min_size=1, max_size=6))
def test_step_sequences_increase_and_keep_deployment(steps: list) -> None:
    gs = [s.global_steps for s in steps]
    assert gs == sorted(set(gs))
    assert len({s.before.only_hybrid for s in steps} | {s.after.only_hybrid for s in steps}) == 1
    records = drive_steps(Good(), steps, is_hybrid_active=True)
    assert records[0].was_active
    for prev, cur in itertools.pairwise(records):
        assert cur.was_active == prev.is_active_after
    for r in records:
        assert r.rebalance_called == r.should_activate
        assert (r.deactivate_wait_samples is not None) == r.should_deactivate
