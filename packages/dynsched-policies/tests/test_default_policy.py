"""`DefaultDynamicSchedulePolicy`: exact arithmetic, gate, bounds, state."""

from __future__ import annotations

import copy
import math

import pytest
from dynsched_core import ConfigError, DynamicScheduleContext, GuardRails
from dynsched_core.testing import contexts, drive_steps, step_sequences
from dynsched_policies import DefaultDynamicSchedulePolicy
from hypothesis import given
from hypothesis import strategies as st


def ctx(
    *,
    required: int = 40,
    sync_steps: int = 1,
    surplus: int = 0,
    waits: tuple[tuple[float, int], ...] = (),
    act: float = 0.0,
    deact: float = 0.0,
    only_hybrid: bool = False,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> DynamicScheduleContext:
    expected = 1000
    return DynamicScheduleContext(
        required_samples=required,
        trigger_parameter_sync_step=sync_steps,
        total_generated_samples=expected + surplus,
        expected_samples=expected,
        step_wait_times=tuple(w for w, _ in waits),
        step_wait_samples=tuple(n for _, n in waits),
        last_activate_duration_s=act,
        last_deactivate_duration_s=deact,
        only_hybrid=only_hybrid,
        num_standalone_replicas=0 if only_hybrid else 2,
        min_deactivate_ratio=bounds[0],
        max_deactivate_ratio=bounds[1],
    )


# -- exact arithmetic of update_after_step ----------------------------------------
def test_ratio_05_with_2_of_40_waited_becomes_055_then_053_without_waits() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    p.update_after_step(1, ctx(required=40, waits=((3.0, 2),)))
    assert p.deactivate_ratio == 0.55  # 0.5 + clip(2/40 = 0.05, 0.02, 0.1)
    p.update_after_step(2, ctx(required=40))
    assert p.deactivate_ratio == 0.53  # no waits: -0.02


def test_no_waits_from_05_gives_048() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    p.update_after_step(1, ctx(required=10, sync_steps=4))
    assert p.deactivate_ratio == 0.48


def test_step_sample_count_uses_whole_cycle() -> None:
    # step_required_samples = 10 * 4 = 40: 2 waited -> +0.05, same as 2 of 40
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    p.update_after_step(1, ctx(required=10, sync_steps=4, waits=((1.0, 1), (1.0, 1))))
    assert p.deactivate_ratio == 0.55


@pytest.mark.parametrize(
    ("waited", "required", "expected"),
    [(1, 100, 0.32), (30, 40, 0.4), (4, 100, 0.34), (10, 100, 0.4), (11, 100, 0.4)],
)
def test_increase_is_clipped_to_002_01(waited: int, required: int, expected: float) -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    p.update_after_step(1, ctx(required=required, waits=((0.0, waited),)))
    assert p.deactivate_ratio == expected


def test_waited_samples_without_wait_time_still_count_as_bottleneck() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    p.update_after_step(1, ctx(waits=((0.0, 4),)))
    assert p.deactivate_ratio == 0.4  # 4/40 = 0.1
    assert p.per_sample_time_s == 1000.0  # W == 0: estimate not replaced


def test_ratio_ignores_the_guard_rails_range_and_the_driver_bounds_the_wait() -> None:
    """The policy keeps its ratio in its own domain [0, 1]; the framework's range is the
    driver's guard rails' business (applied to the wait, the same for every policy)."""
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.2)
    narrow = ctx(bounds=(0.19, 0.25))
    p.update_after_step(1, narrow)
    assert p.deactivate_ratio == 0.18  # not clamped to 0.19 by the policy
    rails = GuardRails(min_deactivate_ratio=0.19, max_deactivate_ratio=0.25)
    target, overrides = rails.wait_target(
        p.deactivate_wait_samples(narrow), narrow, cycle_remaining=40
    )
    assert p.deactivate_wait_samples(narrow) == 7 and target == 7  # floor(0.19 * 40) = 7
    p.update_after_step(2, ctx(waits=((1.0, 40),), bounds=(0.19, 0.25)))
    p.update_after_step(3, ctx(waits=((1.0, 40),), bounds=(0.19, 0.25)))
    assert p.deactivate_ratio == 0.38
    target, overrides = rails.wait_target(
        p.deactivate_wait_samples(narrow), narrow, cycle_remaining=40
    )
    assert (target, [o.rule for o in overrides]) == (10, ["ratio_range"])  # 15 -> 10
    for g in range(4, 30):  # no lower bound drift below 0
        p.update_after_step(g, ctx())
    assert p.deactivate_ratio == 0.0
    for g in range(30, 50):  # nor above 1
        p.update_after_step(g, ctx(waits=((1.0, 40),)))
    assert p.deactivate_ratio == 1.0


def test_no_drift_over_many_steps() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    for g in range(1, 11):
        p.update_after_step(g, ctx())
    assert p.deactivate_ratio == 0.3
    assert p.deactivate_wait_samples(ctx(required=10)) == 3


def test_update_does_nothing_at_step_zero_or_when_colocated() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    before = p.state_dict()
    p.update_after_step(0, ctx(waits=((9.0, 3),), act=5.0))
    p.update_after_step(-1, ctx(waits=((9.0, 3),), act=5.0))
    p.update_after_step(3, ctx(waits=((9.0, 3),), act=5.0, only_hybrid=True))
    assert p.state_dict() == before
    # the constructor flag is verl's; the framework runs the colocated schedule
    q = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5, only_hybrid=True)
    assert q.only_hybrid and q.deactivate_ratio == 0.5


# -- switch overheads and per-sample time -----------------------------------------
def test_switch_overhead_window_keeps_last_three() -> None:
    p = DefaultDynamicSchedulePolicy()
    assert p.switch_cost_s == 10.0
    for g, (a, d) in enumerate(
        [(1.0, 3.0), (0.0, 0.0), (2.0, 4.0), (5.0, 3.0), (10.0, 2.0)], start=1
    ):
        p.update_after_step(g, ctx(act=a, deact=d))
    assert p.switch_overheads_s == (6.0, 8.0, 12.0)  # the zero overhead was not recorded
    assert p.switch_cost_s == pytest.approx(26.0 / 3)
    assert len(p.state_dict()["switch_overheads_s"]) == 3


def test_per_sample_time_stored_even_when_gate_does_not_run() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    c = ctx(surplus=500, waits=((3.0, 6),))  # gap <= 0: the gate returns early
    assert p.should_activate_after_step(1, False, c) is False
    p.update_after_step(1, c)
    assert p.per_sample_time_s == 0.5


# -- the activation gate ----------------------------------------------------------
def test_gap_10_at_01_s_per_sample_does_not_activate_at_2_s_it_does() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    # gap = 0.5 * 40 - 10 = 10 samples
    cheap = ctx(required=40, surplus=10, waits=((1.0, 10),))  # 0.1 s/sample -> 1 s
    slow = ctx(required=40, surplus=10, waits=((20.0, 10),))  # 2 s/sample -> 20 s
    assert p.switch_cost_s == 10.0
    assert p.should_activate_after_step(4, False, cheap) is False
    assert p.should_activate_after_step(4, False, slow) is True


def test_gate_is_strict_at_equality() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    assert p.should_activate_after_step(1, False, ctx(surplus=10, waits=((10.0, 10),))) is False


def test_prior_of_1000_s_activates_on_first_cycle() -> None:
    p = DefaultDynamicSchedulePolicy()
    assert p.per_sample_time_s == 1000.0
    # no measurement at all, gap of a single sample: 1 * 1000 s > 10 s
    c = DynamicScheduleContext(
        required_samples=10,
        trigger_parameter_sync_step=1,
        total_generated_samples=2,
        expected_samples=0,
    )
    assert p.should_activate_after_step(1, False, c) is True


def test_stored_estimate_used_when_cycle_has_no_waits() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    p.update_after_step(1, ctx(surplus=500, waits=((0.5, 10),)))  # 0.05 s/sample stored
    ratio = p.deactivate_ratio
    assert ratio == 0.6
    # gap = 0.6 * 40 = 24 samples * 0.05 s = 1.2 s < 10 s
    assert p.should_activate_after_step(2, False, ctx()) is False
    # a fresh policy (1000 s prior) activates on the same context
    assert DefaultDynamicSchedulePolicy(deactivate_ratio=0.6).should_activate_after_step(
        2, False, ctx()
    )


def test_no_gap_never_activates_even_with_huge_per_sample_time() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.25)
    assert p.should_activate_after_step(1, False, ctx(surplus=10, waits=((1e5, 1),))) is False
    assert p.should_activate_after_step(1, False, ctx(surplus=11, waits=((1e5, 1),))) is False


def test_switch_cost_uses_recorded_overheads() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    p.update_after_step(1, ctx(waits=((1.0, 1),), act=20.0, deact=10.0))  # switch cost 30 s
    # ratio now 0.525; gap = 21 - 10 = 11 samples at 2 s = 22 s < 30 s
    assert p.should_activate_after_step(2, False, ctx(surplus=10, waits=((20.0, 10),))) is False
    assert p.should_activate_after_step(2, False, ctx(surplus=0, waits=((20.0, 10),))) is True


@given(c=contexts(), g=st.integers(0, 100), active=st.booleans())
def test_gate_has_no_side_effects(c: DynamicScheduleContext, g: int, active: bool) -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.4)
    before = p.state_dict()
    first = p.should_activate_after_step(g, active, c)
    assert p.state_dict() == before
    assert p.should_activate_after_step(g, active, c) is first


# -- deactivation -----------------------------------------------------------------
def test_deactivation_follows_hybrid_state_and_ratio() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    assert p.should_deactivate(1, True, ctx()) is True
    assert p.should_deactivate(1, False, ctx()) is False
    assert p.deactivate_wait_samples(ctx(required=40)) == 12
    assert p.deactivate_wait_samples(ctx(required=10, sync_steps=4)) == 12
    assert (
        DefaultDynamicSchedulePolicy(deactivate_ratio=0.29).deactivate_wait_samples(
            ctx(required=100)
        )
        == 29
    )
    assert DefaultDynamicSchedulePolicy(deactivate_ratio=0.0).deactivate_wait_samples(ctx()) == 0


def test_colocated_context_decisions_are_left_to_the_guard_rails() -> None:
    """The policy decides as always; the driver's guard rails apply the colocated schedule."""
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    c = ctx(required=10, sync_steps=4, surplus=10_000, only_hybrid=True)
    assert p.should_activate_after_step(1, False, c) is False
    assert p.deactivate_wait_samples(c) == 12
    rails = GuardRails()
    assert rails.activation(False, c)[0] is True
    assert rails.wait_target(12, c, cycle_remaining=40)[0] == 40
    assert p.deactivate_ratio == 0.3  # configured ratio kept for mixed contexts


def test_request_rebalance_asks_without_side_effects() -> None:
    p = DefaultDynamicSchedulePolicy()
    before = p.state_dict()
    assert p.request_rebalance(1, ctx()) is True
    assert p.state_dict() == before


# -- bounds property --------------------------------------------------------------
@st.composite
def bounds(draw: st.DrawFn) -> tuple[float, float, float]:
    lo = draw(st.floats(0.0, 1.0))
    hi = draw(st.floats(lo, 1.0))
    ratio = draw(st.floats(lo, hi))
    return lo, ratio, hi


@given(b=bounds(), steps=st.lists(st.tuples(st.integers(-2, 10**6), contexts()), max_size=30))
def test_ratio_stays_in_its_domain_and_the_driver_keeps_the_wait_in_range(
    b: tuple[float, float, float], steps: list[tuple[int, DynamicScheduleContext]]
) -> None:
    lo, ratio, hi = b
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=ratio)
    rails = GuardRails(min_deactivate_ratio=lo, max_deactivate_ratio=hi)
    for g, c in steps:
        c = c.evolve(min_deactivate_ratio=lo, max_deactivate_ratio=hi)
        p.update_after_step(g, c)
        assert 0.0 <= p.deactivate_ratio <= 1.0
        proposed = p.deactivate_wait_samples(c)
        assert 0 <= proposed <= c.step_required_samples
        low, high = rails.wait_range(c.step_required_samples)
        target, _ = rails.wait_target(proposed, c.evolve(only_hybrid=False), cycle_remaining=0)
        assert low <= target <= high
        assert len(p.switch_overheads_s) <= 3
        assert math.isfinite(p.per_sample_time_s) and p.per_sample_time_s >= 0


# -- construction -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"deactivate_ratio": 1.5}, r"deactivate_ratio must be in \[0, 1\]"),
        ({"deactivate_ratio": -0.1}, r"deactivate_ratio must be in \[0, 1\]"),
        ({"deactivate_ratio": math.nan}, "deactivate_ratio"),
        ({"prior_per_sample_time_s": 0.0}, "prior_per_sample_time_s"),
        ({"default_switch_cost_s": -1.0}, "default_switch_cost_s"),
        ({"overhead_window": 0}, "overhead_window must be >= 1"),
    ],
)
def test_out_of_range_arguments_are_refused(kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        DefaultDynamicSchedulePolicy(**kwargs)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"deactivate_ratio": "0.3"},
        {"deactivate_ratio": True},
        {"only_hybrid": 1},
        {"overhead_window": 2.0},
    ],
)
def test_wrong_types_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        DefaultDynamicSchedulePolicy(**kwargs)  # type: ignore[arg-type]


# -- state ------------------------------------------------------------------------
@given(steps=step_sequences(min_size=1, max_size=10, only_hybrid=False), split=st.integers(0, 10))
def test_resumed_policy_decides_exactly_as_original(steps: list, split: int) -> None:
    original = DefaultDynamicSchedulePolicy(deactivate_ratio=0.4)
    head = drive_steps(original, steps[:split])
    active = head[-1].is_active_after if head else False
    resumed = DefaultDynamicSchedulePolicy(deactivate_ratio=0.4)
    resumed.load_state_dict(copy.deepcopy(original.state_dict()))
    assert drive_steps(resumed, steps[split:], active) == drive_steps(
        original, steps[split:], active
    )
    assert resumed.state_dict() == original.state_dict()


def test_state_dict_contents() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    p.update_after_step(1, ctx(waits=((4.0, 2),), act=1.0, deact=2.0))
    assert p.state_dict() == {
        "deactivate_ratio": 0.55,
        "switch_overheads_s": [3.0],
        "per_sample_time_s": 2.0,
    }
    p.state_dict()["switch_overheads_s"].append(99.0)  # a copy, not the live list
    assert p.switch_overheads_s == (3.0,)


def test_extreme_observations_keep_a_loadable_state() -> None:
    p = DefaultDynamicSchedulePolicy()
    p.update_after_step(1, ctx(waits=((5e-324, 1000),), act=1e308, deact=1e308))
    assert p.per_sample_time_s == 0.0  # underflow: switching never pays off
    assert p.switch_overheads_s == ()  # an infinite overhead is not recorded
    q = DefaultDynamicSchedulePolicy()
    q.load_state_dict(p.state_dict())
    assert q.state_dict() == p.state_dict()
    assert q.should_activate_after_step(2, False, ctx(waits=((5e-324, 1000),))) is False


def test_load_state_dict_keeps_last_window_entries() -> None:
    p = DefaultDynamicSchedulePolicy()
    p.load_state_dict(
        {
            "deactivate_ratio": 0.4,
            "switch_overheads_s": [1.0, 2.0, 3.0, 4.0],
            "per_sample_time_s": 3.0,
        }
    )
    assert p.switch_overheads_s == (2.0, 3.0, 4.0)
    assert p.deactivate_ratio == 0.4


@pytest.mark.parametrize(
    ("state", "exc", "needle"),
    [
        (
            {"deactivate_ratio": 0.4, "switch_overheads_s": [], "per_sample_time_s": 1.0, "x": 1},
            ValueError,
            "unknown",
        ),
        ({"deactivate_ratio": 0.4, "switch_overheads_s": []}, ValueError, "missing"),
        (
            {"deactivate_ratio": 1.4, "switch_overheads_s": [], "per_sample_time_s": 1.0},
            ValueError,
            "deactivate_ratio",
        ),
        (
            {"deactivate_ratio": 0.4, "switch_overheads_s": [-1.0], "per_sample_time_s": 1.0},
            ValueError,
            "switch_overheads_s",
        ),
        (
            {"deactivate_ratio": 0.4, "switch_overheads_s": "12", "per_sample_time_s": 1.0},
            TypeError,
            "switch_overheads_s",
        ),
        (
            {"deactivate_ratio": 0.4, "switch_overheads_s": [], "per_sample_time_s": -1.0},
            ValueError,
            "per_sample_time_s",
        ),
        (
            {"deactivate_ratio": "0.4", "switch_overheads_s": [], "per_sample_time_s": 1.0},
            TypeError,
            "deactivate_ratio",
        ),
    ],
)
def test_load_state_dict_validates(state: dict, exc: type[Exception], needle: str) -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    before = p.state_dict()
    with pytest.raises(exc, match=needle):
        p.load_state_dict(state)
    assert p.state_dict() == before  # a refused state changes nothing


def test_load_state_dict_ratio_must_be_a_ratio() -> None:
    p = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        p.load_state_dict(
            {"deactivate_ratio": 1.6, "switch_overheads_s": [], "per_sample_time_s": 1.0}
        )
