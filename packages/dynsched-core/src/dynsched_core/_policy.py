"""`DynamicSchedulePolicyBase`: the five decisions a scheduling policy makes."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from dynsched_core._context import DynamicScheduleContext

__all__ = ["DynamicSchedulePolicyBase"]


class DynamicSchedulePolicyBase(abc.ABC):
    """Base class of every dynamic scheduling policy.

    A policy is pure decision logic: it reads an immutable `DynamicScheduleContext` and
    returns plain values. It never talks to Ray, engines or any transport; the
    `ScheduleDriver` performs what it decides. Method names and signatures are those of
    verl's policy base class, so a verl policy ports by changing imports.

    Per training step the driver calls, in this order:

    1. `should_deactivate` before training;
    2. `deactivate_wait_samples` if (1) returned True;
    3. `should_activate_after_step` after the weight sync;
    4. `request_rebalance` after an activation, if rebalance is enabled;
    5. `update_after_step` after the weight sync (same context as 3).

    Optional hooks widen the decision space; their defaults reproduce the published
    behaviour exactly, so a policy that does not override them (verl's included) decides
    as before:

    - `should_activate_mid_cycle` at every step boundary while no hybrid replica is
      active (default False: hybrid replicas join only after a weight sync); a replica
      woken mid-cycle loads the current weights from its own trainer GPU (a local copy,
      not a broadcast);
    - `hybrid_replicas_to_activate` whenever hybrid replicas are activated: how many of
      the live hybrid replicas (k of m) to lend (default None: all of them);
    - `hybrid_replica_ids_to_activate` likewise, naming *which* ones (e.g. per trainer
      node with `DynamicScheduleContext.hybrid_ids_per_node`); it takes precedence over the count when not None;
    - `observe` receives every event of the driver's bus (default: ignored), for
      policies that estimate rates online.

    Constructor arguments must be plain data (numbers, strings, bools) so a policy can
    be built from a YAML/JSON config with `dynsched_core.build_policy`.
    """

    #: Registered name, set by `register_policy` (or the entry point that exposes it).
    name: ClassVar[str] = ""

    @abc.abstractmethod
    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Return True to take hybrid replicas out of rollout before this training step."""

    @abc.abstractmethod
    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """Return how many samples must be buffered before deactivating (>= 0).

        The driver waits (bounded by a timeout and by end-of-stream) until the queue
        holds at least this many samples, then deactivates.
        """

    @abc.abstractmethod
    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Return True to (re-)activate hybrid replicas for the next cycle.

        Called after the weight sync to standalone replicas. When it returns False the
        weight sync to hybrid replicas is skipped.
        """

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        """Decide whether to rebalance in-flight requests after an activation.

        Returns:
            True to ask the driver for a rebalance, False to skip it, or None (the
            default) to follow the ``dynamic_schedule_enable_rebalance`` setting.
            The driver only rebalances when rebalance is enabled in its config.
        """
        return None

    def should_activate_mid_cycle(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Return True to activate hybrid replicas now, at a step boundary inside a cycle.

        Called by the driver before ``should_deactivate`` at every micro-step while no
        hybrid replica is active (not on the last step, not after the producer finished,
        not in colocated mode). The replicas woken load the current weights from their
        own trainer GPUs (the trainer holds them): a local copy, no broadcast. The lend
        then ends like any other: ``should_deactivate`` and ``deactivate_wait_samples``
        of the same step decide when. Default: False (the published behaviour).
        """
        return False

    def hybrid_replicas_to_activate(
        self, global_steps: int, ctx: DynamicScheduleContext
    ) -> int | None:
        """Return how many hybrid replicas to lend (k of ``ctx.num_hybrid_replicas``).

        Called whenever the driver activates (after a weight sync or mid-cycle). The
        driver lends the first ``k`` live hybrid replicas in id order (one per trainer
        node in the usual layout), bounded to ``[1, num_hybrid_replicas]``; ``0`` or a
        negative count is corrected to 1 (deciding not to lend is the activation hooks'
        job). Default: None, every live hybrid replica (the published behaviour).
        """
        return None

    def hybrid_replica_ids_to_activate(
        self, global_steps: int, ctx: DynamicScheduleContext
    ) -> Sequence[str] | None:
        """Return which hybrid replicas to lend (a subset of ``ctx.hybrid_replica_ids``).

        Called whenever the driver activates, before `hybrid_replicas_to_activate`; a
        non-None answer takes precedence over that count. ``ctx.hybrid_replica_nodes``
        gives each replica's node, so a policy can lend per trainer node (see
        `DynamicScheduleContext.hybrid_ids_per_node`). The driver's guard rails drop ids that are not live hybrid
        replicas (and duplicates), reporting a `GuardRailEvent`; an answer left empty
        lends the first replica (not lending is the activation hooks' decision).
        Default: None (the count, or every live hybrid replica: the published behaviour).
        """
        return None

    def observe(self, event: Any) -> None:  # noqa: B027
        """Receive one event of the driver's event bus (default: nothing).

        Events: `TrainStepEvent`, `SwitchEvent`, `RolloutEvent`, `TransitionEvent`, ...
        (`dynsched_core.events`). Must be cheap and must not raise; it runs inside the
        emitter's call.
        """

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:  # noqa: B027
        """Adapt internal state after the weight sync of a cycle (default: nothing)."""

    def state_dict(self) -> dict[str, Any]:
        """Return the learned state as plain data, for checkpoints (default: empty)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state returned by `state_dict`.

        Raises:
            ValueError: ``state`` has keys this policy does not know.
        """
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state, but load_state_dict got keys {sorted(state)}"
            )
