"""`default` and `fixed_ratio`: deactivate-ratio policies with an activation gate."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

from dynsched_core import ConfigError, DynamicScheduleContext, DynamicSchedulePolicyBase
from dynsched_core.derived import ratio_samples

from dynsched_policies._common import (
    check_bool,
    check_number,
    check_state_keys,
    clamp_ratio,
    round_ratio,
)

__all__ = ["DefaultDynamicSchedulePolicy", "FixedRatioDynamicSchedulePolicy"]

logger = logging.getLogger(__name__)


class _RatioPolicy(DynamicSchedulePolicyBase):
    """Common part of `default` and `fixed_ratio`: the ratio and deactivation.

    Bounds and the colocated schedule are not here: the driver's guard rails apply them
    to every policy (`dynsched_core.GuardRails`).
    """

    def __init__(self, deactivate_ratio: float = 0.3, only_hybrid: bool = False) -> None:
        owner = type(self).__name__
        #: What verl passes to a policy's constructor; the driver derives colocated mode
        #: from the live membership and applies the colocated schedule itself.
        self.only_hybrid: bool = check_bool(owner, "only_hybrid", only_hybrid)
        self.deactivate_ratio: float = check_number(
            owner, "deactivate_ratio", deactivate_ratio, 0.0, 1.0
        )

    def _gap(self, ctx: DynamicScheduleContext) -> float:
        """Samples still missing from the ratio's target: ``ratio * S - surplus``."""
        return self.deactivate_ratio * ctx.step_required_samples - ctx.surplus_samples

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Deactivate whenever the hybrid replicas are active (training needs the GPUs)."""
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """``int(deactivate_ratio * step_required_samples)``."""
        return ratio_samples(self.deactivate_ratio, ctx.step_required_samples)

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        """Ask the driver for a rebalance after each activation (subject to its config)."""
        return True


class DefaultDynamicSchedulePolicy(_RatioPolicy):
    """Adaptive deactivate ratio with a cost/benefit activation gate (``default``).

    Hybrid replicas are deactivated before every training step once
    ``int(deactivate_ratio * step_required_samples)`` samples are buffered. After each
    weight sync they are re-activated when the samples still missing,
    ``gap = deactivate_ratio * step_required_samples - (total_generated_samples -
    expected_samples)``, take longer to generate than a switch costs:
    ``gap * per_sample_time > switch_cost``.

    ``per_sample_time`` is the cycle's ``sum(step_wait_times) / sum(step_wait_samples)``
    when both are positive, else the last stored estimate (prior
    ``prior_per_sample_time_s``, 1000 s, deliberately pessimistic so that the first
    cycle activates). ``switch_cost`` is the mean of the last ``overhead_window`` (3)
    measured activate + deactivate durations (``default_switch_cost_s``, 10 s, with none).

    After each weight sync the ratio adapts: if samples had to be waited for (rollout
    was the bottleneck) ``ratio += clip(S / step_required_samples, 0.02, 0.1)`` where
    ``S = sum(step_wait_samples)``, else ``ratio -= 0.02``; then it is kept in its own
    domain ``[0, 1]`` (the framework's range, ``[ctx.min_deactivate_ratio,
    ctx.max_deactivate_ratio]``, is applied to the wait by the driver's guard rails, the
    same for every policy). Cycles run under the framework's colocated schedule (``ctx.only_hybrid``:
    no standalone replica) teach it nothing and are skipped.

    Args:
        deactivate_ratio: Initial ratio, in ``[0, 1]``.
        only_hybrid: What verl passes (colocated as configured); kept for compatibility,
            the driver applies the colocated schedule.
        prior_per_sample_time_s: Per-sample time assumed before any measurement (> 0).
        default_switch_cost_s: Switch cost assumed before any measurement (>= 0).
        overhead_window: How many recent switch overheads are averaged (>= 1).

    Raises:
        TypeError: an argument has the wrong type.
        dynsched_core.ConfigError: an argument is out of range (the message names it and
            the allowed range).
    """

    #: Smallest and largest increase of the ratio after a cycle with waits.
    MIN_INCREASE: ClassVar[float] = 0.02
    MAX_INCREASE: ClassVar[float] = 0.1
    #: Decrease of the ratio after a cycle without waits.
    DECREASE: ClassVar[float] = 0.02

    _STATE_KEYS: ClassVar[frozenset[str]] = frozenset(
        {"deactivate_ratio", "switch_overheads_s", "per_sample_time_s"}
    )

    def __init__(
        self,
        deactivate_ratio: float = 0.3,
        only_hybrid: bool = False,
        *,
        prior_per_sample_time_s: float = 1000.0,
        default_switch_cost_s: float = 10.0,
        overhead_window: int = 3,
    ) -> None:
        super().__init__(deactivate_ratio, only_hybrid)
        owner = type(self).__name__
        self.prior_per_sample_time_s = check_number(
            owner, "prior_per_sample_time_s", prior_per_sample_time_s, math.ulp(0.0), math.inf
        )
        self.default_switch_cost_s = check_number(
            owner, "default_switch_cost_s", default_switch_cost_s, 0.0, math.inf
        )
        if isinstance(overhead_window, bool) or not isinstance(overhead_window, int):
            raise TypeError(
                f"{owner}: overhead_window must be an int >= 1, got {overhead_window!r}"
            )
        if overhead_window < 1:
            raise ConfigError(
                f"{owner}: overhead_window must be >= 1, got {overhead_window}",
                key="overhead_window",
            )
        self.overhead_window = overhead_window
        self._overheads: deque[float] = deque(maxlen=overhead_window)
        self._per_sample_time_s = self.prior_per_sample_time_s

    # -- learned state, read-only views ------------------------------------------
    @property
    def per_sample_time_s(self) -> float:
        """Stored per-sample generation time estimate (seconds)."""
        return self._per_sample_time_s

    @property
    def switch_overheads_s(self) -> tuple[float, ...]:
        """Recorded activate + deactivate durations, oldest first (at most ``overhead_window``)."""
        return tuple(self._overheads)

    @property
    def switch_cost_s(self) -> float:
        """Mean of the recorded switch overheads, or ``default_switch_cost_s`` with none."""
        if not self._overheads:
            return self.default_switch_cost_s
        return sum(self._overheads) / len(self._overheads)

    # -- decisions ----------------------------------------------------------------
    def estimated_per_sample_time_s(self, ctx: DynamicScheduleContext) -> float:
        """This cycle's ``W / S`` when both are positive, else the stored estimate."""
        wait_s, wait_samples = ctx.total_wait_time, ctx.total_wait_samples
        if wait_s > 0 and wait_samples > 0:
            return wait_s / wait_samples
        return self._per_sample_time_s

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Cost/benefit gate: activate iff ``gap * per_sample_time > switch_cost``.

        Does not change the policy's state.
        """
        gap = self._gap(ctx)
        if gap <= 0:
            return False
        return gap * self.estimated_per_sample_time_s(ctx) > self.switch_cost_s

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        """Record the switch overhead and per-sample time, then adapt the ratio."""
        if global_steps <= 0 or ctx.only_hybrid:
            return
        overhead = ctx.last_activate_duration_s + ctx.last_deactivate_duration_s
        if 0 < overhead < math.inf:
            self._overheads.append(overhead)
        wait_s, wait_samples = ctx.total_wait_time, ctx.total_wait_samples
        if wait_s > 0 and wait_samples > 0 and math.isfinite(wait_s):
            # may underflow to 0.0 for absurdly small waits: then switching never pays
            self._per_sample_time_s = wait_s / wait_samples
        if wait_samples > 0:
            step = min(
                max(wait_samples / ctx.step_required_samples, self.MIN_INCREASE), self.MAX_INCREASE
            )
            ratio = self.deactivate_ratio + step
        else:
            ratio = self.deactivate_ratio - self.DECREASE
        ratio = round_ratio(ratio)
        self.deactivate_ratio = clamp_ratio(ratio)
        logger.debug(
            "step %d: deactivate_ratio=%.4f per_sample_time=%.4gs switch_cost=%.4gs",
            global_steps,
            self.deactivate_ratio,
            self._per_sample_time_s,
            self.switch_cost_s,
        )

    # -- checkpointing ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Ratio, overhead window and per-sample time, as plain data."""
        return {
            "deactivate_ratio": self.deactivate_ratio,
            "switch_overheads_s": list(self._overheads),
            "per_sample_time_s": self._per_sample_time_s,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` output after validating every value.

        Raises:
            TypeError: a value has the wrong type.
            ValueError: keys are missing or unknown, or a value is out of range (the
                ratio must lie in ``[0, 1]``).
        """
        owner = type(self).__name__
        check_state_keys(owner, state, self._STATE_KEYS)
        ratio = check_number(
            owner, "state['deactivate_ratio']", state["deactivate_ratio"], 0.0, 1.0
        )
        raw = state["switch_overheads_s"]
        if isinstance(raw, str | bytes) or not hasattr(raw, "__iter__"):
            raise TypeError(
                f"{owner}: state['switch_overheads_s'] must be a list of numbers, got {raw!r}"
            )
        overheads = [
            check_number(owner, f"state['switch_overheads_s'][{i}]", x, math.ulp(0.0), math.inf)
            for i, x in enumerate(raw)
        ]
        if len(overheads) > self.overhead_window:
            logger.info(
                "%s.load_state_dict: keeping the last %d of %d switch overheads",
                owner,
                self.overhead_window,
                len(overheads),
            )
        pst = check_number(
            owner, "state['per_sample_time_s']", state["per_sample_time_s"], 0.0, math.inf
        )
        self.deactivate_ratio = ratio
        self._overheads = deque(overheads, maxlen=self.overhead_window)
        self._per_sample_time_s = pst

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(deactivate_ratio={self.deactivate_ratio!r}, "
            f"only_hybrid={self.only_hybrid!r})"
        )


class FixedRatioDynamicSchedulePolicy(_RatioPolicy):
    """Fixed deactivate ratio and a pure gap test (``fixed_ratio``, ablation baseline).

    Deactivates like `DefaultDynamicSchedulePolicy`; the ratio never changes
    (`update_after_step` does nothing) and the activation rule is the gap test alone:
    activate iff ``total_generated_samples - expected_samples < deactivate_ratio *
    step_required_samples``.

    Args:
        deactivate_ratio: The ratio, in ``[0, 1]``.
        only_hybrid: What verl passes (colocated as configured); kept for compatibility,
            the driver applies the colocated schedule.

    Raises:
        TypeError: an argument has the wrong type.
        dynsched_core.ConfigError: an argument is out of range.
    """

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Activate iff the surplus is below ``deactivate_ratio * step_required_samples``."""
        return ctx.surplus_samples < self.deactivate_ratio * ctx.step_required_samples

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(deactivate_ratio={self.deactivate_ratio!r}, "
            f"only_hybrid={self.only_hybrid!r})"
        )
