"""`GuardRails`: the bounds the framework applies to every policy's decisions, once.

A policy proposes; the `ScheduleDriver` applies these rules to the proposal and reports
each correction (a `GuardRailOverride` in its results, a `GuardRailEvent` on its bus, a
log line). They hold for built-in and third-party policies alike, so a policy does not
(and need not) implement any of them:

``deactivate_wait_samples`` (the wait before deactivating), in this order:

1. ``ratio_range``: clamped to ``[floor(min_deactivate_ratio * S), floor(max_deactivate_ratio
   * S)]`` with ``S = step_required_samples`` (default ``[0, S]``);
2. ``colocated``: with no live standalone replica, raised to the samples the rest of the
   cycle still needs, since nothing produces once the hybrid replicas sleep;
3. ``queue_capacity``: lowered to the queue's capacity (a longer wait could never end).

``should_activate_after_step``:

1. ``end_of_run``: never on the last step or once the producer has finished;
2. ``colocated``: always otherwise, with no live standalone replica (hybrid replicas are
   the only producers).

Colocated mode is derived in one place, `is_colocated`, from the live membership.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from dynsched_core import validators as v
from dynsched_core._context import DynamicScheduleContext
from dynsched_core.derived import check_ratio_range, ratio_samples

__all__ = ["GuardRailOverride", "GuardRailRule", "GuardRails", "is_colocated"]

GuardRailRule = Literal[
    "ratio_range", "colocated", "queue_capacity", "end_of_run", "live_hybrid_replicas"
]
Decision = Literal[
    "deactivate_wait_samples", "should_activate_after_step", "hybrid_replica_ids_to_activate"
]


def is_colocated(scheduling_enabled: bool, standalone_replicas: int) -> bool:
    """Colocated (``only_hybrid``) mode: dynamic scheduling on and no standalone replica.

    The one definition; the config applies it to the configured replica count, the
    driver to the live membership.
    """
    return scheduling_enabled and standalone_replicas == 0


@attrs.frozen(kw_only=True)
class GuardRailOverride:
    """One correction of a policy's decision by the `GuardRails`.

    Attributes:
        decision: ``deactivate_wait_samples``, ``should_activate_after_step`` or
            ``hybrid_replica_ids_to_activate``.
        rule: The rule that corrected it (see `GuardRails`; ``live_hybrid_replicas``: the
            driver lends only live hybrid replicas, each once, at least one).
        proposed: What the policy returned (replica ids as a tuple).
        applied: What the driver did instead.
        reason: One human-readable sentence.
    """

    decision: Decision
    rule: GuardRailRule
    proposed: int | bool | tuple[str, ...]
    applied: int | bool | tuple[str, ...]
    reason: str


#: How each decision's override reads (after the decision's name).
_OVERRIDE_REASONS: dict[Decision, str] = {
    "deactivate_wait_samples": "{proposed} {why}: waiting for {applied}",
    "should_activate_after_step": "{proposed} overridden ({why}): {applied}",
    "hybrid_replica_ids_to_activate": "{proposed} corrected ({why}): lending {applied}",
}


def guard_override(
    decision: Decision,
    rule: GuardRailRule,
    proposed: int | bool | tuple[str, ...],
    applied: int | bool | tuple[str, ...],
    why: str,
) -> GuardRailOverride:
    """The `GuardRailOverride` of ``rule`` correcting ``decision``, its reason worded once."""

    def shown(value: int | bool | tuple[str, ...]) -> object:
        return list(value) if isinstance(value, tuple) else value

    text = _OVERRIDE_REASONS[decision].format(
        proposed=shown(proposed), applied=shown(applied), why=why
    )
    return GuardRailOverride(
        decision=decision,
        rule=rule,
        proposed=proposed,
        applied=applied,
        reason=f"{decision} {text}",
    )


@attrs.frozen(kw_only=True)
class GuardRails:
    """The bounds applied after every policy decision (configured from the config).

    Attributes:
        min_deactivate_ratio: Lower bound of the wait before deactivating, as a fraction
            of a cycle's samples, in ``[0, 1]``
            (``async_training.dynamic_schedule_min_deactivate_ratio``).
        max_deactivate_ratio: Upper bound, in ``[min_deactivate_ratio, 1]``
            (``async_training.dynamic_schedule_max_deactivate_ratio``).

    Example:
        >>> rails = GuardRails(max_deactivate_ratio=0.5)
        >>> ctx = DynamicScheduleContext(required_samples=10, trigger_parameter_sync_step=4)
        >>> target, overrides = rails.wait_target(35, ctx, cycle_remaining=40)
        >>> target, overrides[0].rule
        (20, 'ratio_range')
    """

    min_deactivate_ratio: float = attrs.field(default=0.0, validator=v.float_in(0.0, 1.0))
    max_deactivate_ratio: float = attrs.field(default=1.0, validator=v.float_in(0.0, 1.0))

    def __attrs_post_init__(self) -> None:
        check_ratio_range(type(self).__name__, self.min_deactivate_ratio, self.max_deactivate_ratio)

    @classmethod
    def from_config(cls, config: Any) -> GuardRails:
        """The guard rails a `DynamicScheduleConfig` asks for."""
        return cls(
            min_deactivate_ratio=config.dynamic_schedule_min_deactivate_ratio,
            max_deactivate_ratio=config.dynamic_schedule_max_deactivate_ratio,
        )

    def wait_range(self, step_required_samples: int) -> tuple[int, int]:
        """The allowed wait before deactivating, in samples: ``(low, high)``."""
        return (
            ratio_samples(self.min_deactivate_ratio, step_required_samples),
            ratio_samples(self.max_deactivate_ratio, step_required_samples),
        )

    def wait_target(
        self,
        proposed: int,
        ctx: DynamicScheduleContext,
        *,
        cycle_remaining: int,
        capacity: int | None = None,
    ) -> tuple[int, tuple[GuardRailOverride, ...]]:
        """Bound a policy's ``deactivate_wait_samples``.

        Args:
            proposed: The policy's answer (an int; negative values are corrected too).
            ctx: The context the policy decided on (``only_hybrid`` is the colocated flag).
            cycle_remaining: Samples the rest of the current cycle still needs.
            capacity: The sample queue's capacity (None: unbounded).

        Returns:
            The wait target and the corrections made (empty when none).
        """
        overrides: list[GuardRailOverride] = []
        target = proposed
        low, high = self.wait_range(ctx.step_required_samples)
        if not low <= target <= high:
            bounded = min(max(target, low), high)
            overrides.append(
                guard_override(
                    "deactivate_wait_samples",
                    "ratio_range",
                    target,
                    bounded,
                    f"outside [{low}, {high}] (deactivate ratio range "
                    f"[{self.min_deactivate_ratio:g}, {self.max_deactivate_ratio:g}] of "
                    f"{ctx.step_required_samples} samples per cycle)",
                )
            )
            target = bounded
        if ctx.only_hybrid and target < cycle_remaining:
            overrides.append(
                guard_override(
                    "deactivate_wait_samples",
                    "colocated",
                    target,
                    cycle_remaining,
                    "below the rest of the cycle, and no standalone replica produces while "
                    "the hybrid replicas sleep",
                )
            )
            target = cycle_remaining
        if capacity is not None and target > capacity:
            overrides.append(
                guard_override(
                    "deactivate_wait_samples",
                    "queue_capacity",
                    target,
                    capacity,
                    "above the queue's capacity",
                )
            )
            target = capacity
        return target, tuple(overrides)

    def activation(
        self, wants: bool, ctx: DynamicScheduleContext
    ) -> tuple[bool, tuple[GuardRailOverride, ...]]:
        """Bound a policy's ``should_activate_after_step``.

        Returns:
            Whether to activate and the corrections made (empty when none).
        """
        if ctx.is_last_step or ctx.producer_finished:
            if not wants:
                return False, ()
            why = "the last training step" if ctx.is_last_step else "the producer has finished"
            return False, (
                guard_override("should_activate_after_step", "end_of_run", wants, False, why),
            )
        if ctx.only_hybrid and not wants:
            return True, (
                guard_override(
                    "should_activate_after_step",
                    "colocated",
                    wants,
                    True,
                    "no standalone replica: hybrid replicas are the only producers",
                ),
            )
        return wants, ()
