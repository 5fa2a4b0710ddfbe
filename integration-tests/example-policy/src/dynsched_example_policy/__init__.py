"""An example third-party policy: activate hybrid replicas while the queue is short.

Written against dynsched policy API 1.0: the distribution pins the dynsched-core series it
is tested with (``dynsched-core>=0.1.0,<0.2``) and checks the policy API at import time,
so an incompatible core fails here, with a message, instead of mid-run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynsched_core import DynamicScheduleContext, DynamicSchedulePolicyBase, require_policy_api

__all__ = ["POLICY_API", "ThresholdPolicy"]

#: The dynsched policy API this package is written against.
POLICY_API = "1.0"

require_policy_api(POLICY_API, by="dynsched-example-policy")


class ThresholdPolicy(DynamicSchedulePolicyBase):
    """Activate while the buffered surplus is below ``threshold`` of a cycle's demand.

    Deactivates once ``threshold * step_required_samples`` samples are buffered. Keeps
    one piece of state, the number of activations, to exercise checkpointing.
    """

    def __init__(self, threshold: float = 0.5, only_hybrid: bool = False) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        self.threshold = float(threshold)
        self.only_hybrid = bool(only_hybrid)
        self.activations = 0

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        if self.only_hybrid or ctx.only_hybrid:
            return ctx.step_required_samples
        return int(self.threshold * ctx.step_required_samples)

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        if self.only_hybrid or ctx.only_hybrid:
            return True
        return ctx.surplus_samples < self.threshold * ctx.step_required_samples

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        if self.should_activate_after_step(global_steps, False, ctx):
            self.activations += 1

    def state_dict(self) -> dict[str, Any]:
        return {"activations": self.activations}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unknown = set(state) - {"activations"}
        if unknown:
            raise ValueError(f"ThresholdPolicy.load_state_dict: unknown keys {sorted(unknown)}")
        self.activations = int(state.get("activations", 0))
