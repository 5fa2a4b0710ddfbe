"""`static_fully_async`: the plain fully-async baseline and its colocated fallback."""

from __future__ import annotations

from dynsched_core import DynamicScheduleContext, DynamicSchedulePolicyBase

from dynsched_policies._common import check_bool, check_number

__all__ = ["StaticFullyAsyncPolicy"]


class StaticFullyAsyncPolicy(DynamicSchedulePolicyBase):
    """Plain fully-async training: hybrid replicas never generate (``static_fully_async``).

    With standalone replicas it never activates, waits for nothing before deactivating
    (``deactivate_wait_samples == 0``) and learns nothing: trainer GPUs always train.

    With no standalone replicas (``only_hybrid=True``, or a context whose
    ``only_hybrid`` is set) it runs the classic colocated schedule instead: activate
    after every weight sync, and before training deactivate once the whole cycle's
    samples (``step_required_samples``) are buffered. Someone always produces what the
    trainer will consume, so it cannot deadlock (the published version deactivates
    without waiting and never re-activates, so a colocated run waits forever).

    Args:
        only_hybrid: No standalone replicas (colocated mode).
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

    def _colocated(self, ctx: DynamicScheduleContext) -> bool:
        return self.only_hybrid or ctx.only_hybrid

    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Deactivate whenever the hybrid replicas are active."""
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """0; the whole cycle (``step_required_samples``) when colocated."""
        return ctx.step_required_samples if self._colocated(ctx) else 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Never, except after every weight sync when colocated."""
        return self._colocated(ctx)

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        """Never rebalance: a colocated activation has no other replica to balance against."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(only_hybrid={self.only_hybrid!r})"
