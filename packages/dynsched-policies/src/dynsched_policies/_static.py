"""`static_fully_async`: the plain fully-async baseline and its colocated fallback."""

from __future__ import annotations

from dynsched_core import DynamicScheduleContext, DynamicSchedulePolicyBase

from dynsched_policies._common import check_bool, check_number

__all__ = ["StaticFullyAsyncPolicy"]


class StaticFullyAsyncPolicy(DynamicSchedulePolicyBase):
    """Plain fully-async training: hybrid replicas never generate (``static_fully_async``).

    It never activates, waits for nothing before deactivating
    (``deactivate_wait_samples == 0``) and learns nothing: trainer GPUs always train.

    With no standalone replica the driver's guard rails run the classic colocated
    schedule instead (activate after every weight sync, deactivate once the rest of the
    cycle's samples are buffered), for this policy as for any other, so a colocated run
    cannot deadlock (the published version, left to itself, deactivates without waiting
    and never re-activates, so a colocated run waits forever).

    Args:
        only_hybrid: What verl passes (colocated as configured); kept for compatibility,
            the driver applies the colocated schedule.
        deactivate_ratio: Accepted for configuration compatibility with the other
            policies (validated to lie in ``[0, 1]``) and otherwise ignored.

    Raises:
        TypeError: an argument has the wrong type.
        dynsched_core.ConfigError: ``deactivate_ratio`` is out of range.
    """

    def __init__(self, only_hybrid: bool = False, deactivate_ratio: float = 0.0) -> None:
        owner = type(self).__name__
        self.only_hybrid: bool = check_bool(owner, "only_hybrid", only_hybrid)
        check_number(owner, "deactivate_ratio", deactivate_ratio, 0.0, 1.0)

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Deactivate whenever the hybrid replicas are active."""
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """0: nothing to wait for, the hybrid replicas never generate."""
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Never."""
        return False

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        """Never rebalance: a colocated activation has no other replica to balance against."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(only_hybrid={self.only_hybrid!r})"
