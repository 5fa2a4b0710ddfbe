"""Deterministic policies for the end-to-end tests (decisions never depend on timing)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynsched_core import DynamicScheduleContext, DynamicSchedulePolicyBase


class ScriptedPolicy(DynamicSchedulePolicyBase):
    """Deactivates on even micro-steps, activates after syncs of versions not divisible by 3.

    Keeps a call counter as its learned state, to check checkpoint/restore.
    """

    name = "scripted-test"

    def __init__(self) -> None:
        self.updates = 0

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        step = ctx.expected_samples // ctx.required_samples
        return is_hybrid_active and step % 2 == 0

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return ctx.param_version % 3 != 0

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.updates = int(state["updates"])


class AlwaysSwitchPolicy(DynamicSchedulePolicyBase):
    """Activates after every sync and deactivates before every step while active."""

    name = "always-switch-test"

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return True


class PartialMidCyclePolicy(DynamicSchedulePolicyBase):
    """Never lends after a sync; lends one hybrid replica (k of m) at every step boundary
    inside a cycle and gives it back once a micro-batch is buffered (the widened hooks)."""

    name = "partial-mid-cycle-test"

    def __init__(self) -> None:
        self.lent_counts: list[int] = []

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        if is_hybrid_active:
            self.lent_counts.append(ctx.num_active_hybrid_replicas)
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return ctx.required_samples

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return global_steps == 0  # something must generate before the first step

    def should_activate_mid_cycle(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return True

    def hybrid_replicas_to_activate(self, global_steps: int, ctx: DynamicScheduleContext) -> int:
        return 1


class NeverActivatePolicy(DynamicSchedulePolicyBase):
    """Hybrid replicas sleep unless a guard rail or a failover wakes them."""

    name = "never-activate-test"

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return False


class OnePerNodePolicy(PartialMidCyclePolicy):
    """`PartialMidCyclePolicy`, naming the replicas: the first hybrid of each node."""

    name = "one-per-node-test"

    def __init__(self) -> None:
        super().__init__()
        self.nodes_seen: list[tuple[str, ...]] = []

    def hybrid_replica_ids_to_activate(
        self, global_steps: int, ctx: DynamicScheduleContext
    ) -> tuple[str, ...]:
        self.nodes_seen.append(ctx.hybrid_replica_nodes)
        return ctx.hybrid_ids_per_node(1)
