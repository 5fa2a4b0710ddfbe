from __future__ import annotations

import attrs
import pytest
from dynsched_core import DynamicScheduleContext


def test_derived_fields() -> None:
    ctx = DynamicScheduleContext(
        required_samples=16,
        trigger_parameter_sync_step=4,
        total_generated_samples=70,
        expected_samples=64,
        step_wait_times=(1.5, 2.5),
        step_wait_samples=(3, 5),
    )
    assert ctx.step_required_samples == 64
    assert ctx.total_wait_time == 4.0
    assert ctx.total_wait_samples == 8
    assert ctx.surplus_samples == 6


def test_frozen() -> None:
    ctx = DynamicScheduleContext(required_samples=1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ctx.required_samples = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("required_samples", 0, "required_samples must be >= 1"),
        ("trigger_parameter_sync_step", 0, "trigger_parameter_sync_step must be >= 1"),
        ("total_generated_samples", -1, "total_generated_samples must be >= 0"),
        ("expected_samples", -3, "expected_samples must be >= 0"),
        ("buffer_samples", -1, "buffer_samples must be >= 0"),
        ("queue_size", -1, "queue_size must be >= 0"),
        ("last_activate_duration_s", -0.5, "last_activate_duration_s must be a finite number >= 0"),
        ("last_deactivate_duration_s", float("nan"), "last_deactivate_duration_s"),
    ],
)
def test_bad_values_name_the_field_and_range(field: str, value: object, needle: str) -> None:
    kwargs: dict[str, object] = {"required_samples": 4, field: value}
    with pytest.raises(ValueError, match=needle):
        DynamicScheduleContext(**kwargs)  # type: ignore[arg-type]


def test_wrong_types_are_refused() -> None:
    with pytest.raises(TypeError, match="required_samples must be an int"):
        DynamicScheduleContext(required_samples=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="only_hybrid must be a bool"):
        DynamicScheduleContext(required_samples=2, only_hybrid=1)  # type: ignore[arg-type]


def test_wait_lists_are_validated_and_paired() -> None:
    with pytest.raises(ValueError, match=r"step_wait_times\[1\] must be a finite number >= 0"):
        DynamicScheduleContext(
            required_samples=2, step_wait_times=(1.0, -1.0), step_wait_samples=(1, 1)
        )
    with pytest.raises(ValueError, match="same length"):
        DynamicScheduleContext(required_samples=2, step_wait_times=(1.0,), step_wait_samples=())
    ctx = DynamicScheduleContext(required_samples=2, step_wait_times=[1.0], step_wait_samples=[2])  # type: ignore[arg-type]
    assert ctx.step_wait_times == (1.0,)
    assert ctx.step_wait_samples == (2,)


def test_evolve_validates() -> None:
    ctx = DynamicScheduleContext(required_samples=2)
    assert ctx.evolve(queue_size=5).queue_size == 5
    with pytest.raises(ValueError, match="queue_size"):
        ctx.evolve(queue_size=-5)
