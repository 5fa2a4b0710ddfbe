"""`DynamicScheduleContext`: the read-only snapshot a policy decides on."""

from __future__ import annotations

from typing import Any

import attrs

from dynsched_core import validators as v
from dynsched_core.derived import check_ratio_range, step_required_samples

__all__ = ["DynamicScheduleContext"]


def _tuple_floats(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


def _str_tuple(x: Any) -> tuple[Any, ...]:
    if isinstance(x, str):  # a lone id is not a collection of ids
        raise TypeError(f"expected a sequence of replica ids or nodes, got the string {x!r}")
    return tuple(x)


def _str_items(inst: Any, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    bad = [x for x in value if not isinstance(x, str)]
    if bad:
        raise TypeError(
            f"DynamicScheduleContext.{attribute.name} must hold strings, got {bad[0]!r}"
        )


@attrs.frozen(kw_only=True)
class DynamicScheduleContext:
    """Immutable snapshot of the fully-async loop, built by the driver for each policy call.

    Field names follow verl's ``DynamicScheduleContext`` so a verl policy ports by
    changing imports. Counts are in *samples* (one sample = one prompt group as the
    trainer consumes it).

    Attributes:
        required_samples: Samples the trainer consumes per micro-step (>= 1).
        trigger_parameter_sync_step: Micro-steps per weight sync, ``T`` (>= 1).
        total_generated_samples: Samples produced by the rollouter since the start (>= 0).
        expected_samples: Samples the trainer has asked for so far: consumed samples plus
            the current cycle's demand as counted by the driver (>= 0).
        buffer_samples: Samples the rollouter may produce ahead of demand (staleness
            allowance, ``staleness_threshold * step_required_samples``) (>= 0).
        step_wait_times: Seconds the trainer waited, one entry per sample collection of
            the cycle just finished (each >= 0).
        step_wait_samples: Samples that had to be waited for (not served from backlog),
            one entry per collection, same length as ``step_wait_times`` (each >= 0).
        only_hybrid: True when there is no live standalone replica (colocated mode); the
            driver derives it once from the live membership and applies the colocated
            schedule itself (see `dynsched_core.GuardRails`).
        last_activate_duration_s: Duration of the most recent activation (>= 0).
        last_deactivate_duration_s: Duration of the most recent deactivation (>= 0).
        queue_size: Samples currently buffered in the sample queue (>= 0).
        num_standalone_replicas: Standalone rollout replicas alive (>= 0).
        num_hybrid_replicas: Hybrid replicas configured on trainer GPUs (>= 0).
        standalone_gpus: GPUs of the standalone pool (>= 0).
        hybrid_gpus: Trainer GPUs that host hybrid replicas (>= 0).
        producer_finished: True once the rollouter will produce no more samples.
        is_last_step: True when the step being decided on is the last training step.
        param_version: Current weight version (>= 0).
        now: The loop clock's time when the snapshot was taken (seconds).
        min_deactivate_ratio: Lower bound of the guard rails' deactivate ratio range, in
            ``[0, 1]``: the driver never waits for fewer than ``floor(min *
            step_required_samples)`` samples before deactivating (a policy that adapts a
            ratio keeps it inside the range).
        max_deactivate_ratio: Upper bound of that range, in ``[min_deactivate_ratio, 1]``.
        num_active_hybrid_replicas: Hybrid replicas lent to rollout right now (``0`` when
            none is; at most ``num_hybrid_replicas`` while switching is settled) (>= 0).
        cycle_step: Micro-steps of the current weight-sync cycle requested so far, the
            one being decided on included: ``1..trigger_parameter_sync_step`` before a
            training step, ``trigger_parameter_sync_step`` after the weight sync that
            ends the cycle, ``0`` before the first step (>= 0).
        hybrid_replica_ids: The live hybrid replicas, in the order the driver lends them
            by default (``len == num_hybrid_replicas`` when the driver builds it; ``()``
            in a hand-built context).
        hybrid_replica_nodes: The node of each of ``hybrid_replica_ids`` (same length;
            ``""`` where the runtime does not know it), for lending per trainer node.
    """

    required_samples: int = attrs.field(validator=v.int_ge(1))
    trigger_parameter_sync_step: int = attrs.field(default=1, validator=v.int_ge(1))
    total_generated_samples: int = attrs.field(default=0, validator=v.int_ge(0))
    expected_samples: int = attrs.field(default=0, validator=v.int_ge(0))
    buffer_samples: int = attrs.field(default=0, validator=v.int_ge(0))
    step_wait_times: tuple[float, ...] = attrs.field(
        default=(), converter=_tuple_floats, validator=v.tuple_of_floats_ge(0.0)
    )
    step_wait_samples: tuple[int, ...] = attrs.field(
        default=(), converter=_tuple_floats, validator=v.tuple_of_ints_ge(0)
    )
    only_hybrid: bool = attrs.field(default=False, validator=v.bool_())
    last_activate_duration_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    last_deactivate_duration_s: float = attrs.field(default=0.0, validator=v.float_ge(0.0))
    queue_size: int = attrs.field(default=0, validator=v.int_ge(0))
    num_standalone_replicas: int = attrs.field(default=0, validator=v.int_ge(0))
    num_hybrid_replicas: int = attrs.field(default=0, validator=v.int_ge(0))
    standalone_gpus: int = attrs.field(default=0, validator=v.int_ge(0))
    hybrid_gpus: int = attrs.field(default=0, validator=v.int_ge(0))
    producer_finished: bool = attrs.field(default=False, validator=v.bool_())
    is_last_step: bool = attrs.field(default=False, validator=v.bool_())
    param_version: int = attrs.field(default=0, validator=v.int_ge(0))
    now: float = attrs.field(default=0.0, validator=v.float_ge(float("-inf")))
    min_deactivate_ratio: float = attrs.field(default=0.0, validator=v.float_in(0.0, 1.0))
    max_deactivate_ratio: float = attrs.field(default=1.0, validator=v.float_in(0.0, 1.0))
    num_active_hybrid_replicas: int = attrs.field(default=0, validator=v.int_ge(0))
    cycle_step: int = attrs.field(default=0, validator=v.int_ge(0))
    hybrid_replica_ids: tuple[str, ...] = attrs.field(
        default=(), converter=_str_tuple, validator=_str_items
    )
    hybrid_replica_nodes: tuple[str, ...] = attrs.field(
        default=(), converter=_str_tuple, validator=_str_items
    )

    def __attrs_post_init__(self) -> None:
        check_ratio_range(
            "DynamicScheduleContext", self.min_deactivate_ratio, self.max_deactivate_ratio
        )
        if len(self.hybrid_replica_nodes) != len(self.hybrid_replica_ids):
            raise ValueError(
                "DynamicScheduleContext.hybrid_replica_nodes must name the node of each of "
                f"hybrid_replica_ids (same length), got {len(self.hybrid_replica_nodes)} and "
                f"{len(self.hybrid_replica_ids)}"
            )
        if len(set(self.hybrid_replica_ids)) != len(self.hybrid_replica_ids):
            raise ValueError(
                "DynamicScheduleContext.hybrid_replica_ids must be distinct, got "
                f"{list(self.hybrid_replica_ids)}"
            )
        if len(self.step_wait_times) != len(self.step_wait_samples):
            raise ValueError(
                "DynamicScheduleContext.step_wait_times and step_wait_samples must have the same "
                f"length (one entry per sample collection), got {len(self.step_wait_times)} and "
                f"{len(self.step_wait_samples)}"
            )

    @property
    def step_required_samples(self) -> int:
        """Samples consumed per weight-sync cycle: ``required_samples * trigger_parameter_sync_step``."""
        return step_required_samples(self.required_samples, self.trigger_parameter_sync_step)

    @property
    def total_wait_time(self) -> float:
        """``sum(step_wait_times)``: seconds waited for samples in the last cycle."""
        return float(sum(self.step_wait_times))

    @property
    def total_wait_samples(self) -> int:
        """``sum(step_wait_samples)``: samples waited for in the last cycle."""
        return int(sum(self.step_wait_samples))

    @property
    def surplus_samples(self) -> int:
        """``total_generated_samples - expected_samples`` (negative when behind demand)."""
        return self.total_generated_samples - self.expected_samples

    def hybrid_ids_per_node(self, per_node: int) -> tuple[str, ...]:
        """The first ``per_node`` hybrid replicas of each node (partial lending per node).

        For `DynamicSchedulePolicyBase.hybrid_replica_ids_to_activate`. Nodes come from
        ``hybrid_replica_nodes`` (replicas of an unknown node, ``""``, count as one node);
        within a node replicas are taken in ``hybrid_replica_ids`` order, and the result
        keeps that order.

        Raises:
            ValueError: ``per_node`` is not an int >= 1.

        Example:
            >>> ctx = DynamicScheduleContext(
            ...     required_samples=4,
            ...     hybrid_replica_ids=("h0", "h1", "h2", "h3"),
            ...     hybrid_replica_nodes=("n0", "n0", "n1", "n1"),
            ... )
            >>> ctx.hybrid_ids_per_node(1)
            ('h0', 'h2')
        """
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise ValueError(f"per_node must be an int >= 1, got {per_node!r}")
        taken: dict[str, int] = {}
        out = []
        for rid, node in zip(self.hybrid_replica_ids, self.hybrid_replica_nodes, strict=True):
            if taken.get(node, 0) < per_node:
                taken[node] = taken.get(node, 0) + 1
                out.append(rid)
        return tuple(out)

    def evolve(self, **changes: Any) -> DynamicScheduleContext:
        """Return a copy with ``changes`` applied (validated again)."""
        return attrs.evolve(self, **changes)
