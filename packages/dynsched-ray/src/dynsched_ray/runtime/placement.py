"""Placement groups of the two GPU pools: trainer (hybrid replicas colocated) and standalone.

Layout:

- trainer pool: one bundle ``{"GPU": 1}`` per trainer GPU. Trainer worker ``k`` takes a
  ``trainer_gpu_fraction`` of bundle ``k``; hybrid replica ``i`` (``gpus_per_replica``
  GPUs) takes ``hybrid_gpu_fraction`` of bundle ``i * gpus_per_replica``, i.e. the very
  GPUs of the trainer workers (they time-share them: asleep while the trainer trains).
- standalone pool: one bundle ``{"GPU": gpus_per_replica}`` per standalone replica.

`replica_placement` is the one place where a replica's bundle and GPU ids are computed;
the fleet records its answer in the run's `ReplicaSet` (`dynsched_core.ReplicaSet`), and
everything else (respawns, the trainer group's hand-over) reads it from there.

Ray GPUs are scheduling resources, so a CPU-only machine started with
``ray.init(num_gpus=8)`` exercises the same placement.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

import attrs
import ray
from dynsched_core.rollout import ReplicaPlacement
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dynsched_ray.runtime.errors import RemoteCallTimeoutError
from dynsched_ray.runtime.remote import await_ref

__all__ = ["Pool", "ResourcePools", "replica_placement"]

logger = logging.getLogger(__name__)

Pool = Literal["trainer", "standalone"]
_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _pos_int(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def replica_placement(
    role: Literal["standalone", "hybrid"], index: int, gpus_per_replica: int
) -> ReplicaPlacement:
    """Where replica ``index`` of ``role`` sits: its pool, bundle and the pool's GPU ids.

    A hybrid replica takes ``gpus_per_replica`` consecutive trainer GPUs starting at
    bundle ``index * gpus_per_replica`` (the GPUs of the trainer workers of those ranks);
    a standalone replica has bundle ``index`` of the standalone pool to itself.

    Example:
        >>> replica_placement("hybrid", 1, 2)
        ReplicaPlacement(pool='trainer', bundle=2, gpu_ids=(2, 3), node='')
    """
    _pos_int("index", index, 0)
    _pos_int("gpus_per_replica", gpus_per_replica, 1)
    first = index * gpus_per_replica
    gpus = range(first, first + gpus_per_replica)
    if role == "hybrid":
        return ReplicaPlacement(pool="trainer", bundle=first, gpu_ids=gpus)
    if role == "standalone":
        return ReplicaPlacement(pool="standalone", bundle=index, gpu_ids=gpus)
    raise ValueError(f"role must be one of ['standalone', 'hybrid'], got {role!r}")


@attrs.define
class ResourcePools:
    """The trainer and standalone placement groups of one run.

    Build with `ResourcePools.create`; await `ready` before placing actors.

    Attributes:
        trainer: Placement group of the trainer pool (``None`` without trainer GPUs).
        standalone: Placement group of the standalone pool (``None`` without standalone
            replicas, e.g. the colocated ``rollout.nnodes=0`` set-up).
        gpus_per_replica: GPUs of one rollout replica (tensor parallel size).
        trainer_gpus: Bundles (GPUs) of the trainer pool.
        standalone_replicas: Bundles of the standalone pool (one per replica).
    """

    trainer: PlacementGroup | None
    standalone: PlacementGroup | None
    gpus_per_replica: int
    trainer_gpus: int
    standalone_replicas: int

    @classmethod
    def create(
        cls,
        *,
        trainer_gpus: int,
        standalone_replicas: int,
        gpus_per_replica: int = 1,
        cpus_per_bundle: float = 0.0,
        strategy: str = "PACK",
        name_prefix: str = "dynsched",
    ) -> ResourcePools:
        """Reserve the two pools (returns at once; `ready` waits for the reservation).

        Args:
            trainer_gpus: GPUs of the trainer pool (>= 0).
            standalone_replicas: Standalone replicas (>= 0), ``gpus_per_replica`` GPUs each.
            gpus_per_replica: GPUs per rollout replica (>= 1).
            cpus_per_bundle: CPUs reserved per bundle besides the GPUs (>= 0).
            strategy: Ray placement strategy of both groups: one of PACK, SPREAD,
                STRICT_PACK, STRICT_SPREAD.
            name_prefix: Placement group names are ``<prefix>-trainer`` / ``-standalone``.
        """
        _pos_int("trainer_gpus", trainer_gpus, 0)
        _pos_int("standalone_replicas", standalone_replicas, 0)
        _pos_int("gpus_per_replica", gpus_per_replica, 1)
        if strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be one of {list(_STRATEGIES)}, got {strategy!r}")
        if isinstance(cpus_per_bundle, bool) or not cpus_per_bundle >= 0:
            raise ValueError(f"cpus_per_bundle must be a number >= 0, got {cpus_per_bundle!r}")

        def bundle(gpus: int) -> dict[str, float]:
            b: dict[str, float] = {"GPU": float(gpus)}
            if cpus_per_bundle > 0:
                b["CPU"] = float(cpus_per_bundle)
            return b

        trainer = (
            placement_group(
                [bundle(1)] * trainer_gpus, strategy=strategy, name=f"{name_prefix}-trainer"
            )
            if trainer_gpus
            else None
        )
        standalone = (
            placement_group(
                [bundle(gpus_per_replica)] * standalone_replicas,
                strategy=strategy,
                name=f"{name_prefix}-standalone",
            )
            if standalone_replicas
            else None
        )
        return cls(trainer, standalone, gpus_per_replica, trainer_gpus, standalone_replicas)

    @property
    def hybrid_replicas(self) -> int:
        """Hybrid replicas the trainer pool holds (``trainer_gpus // gpus_per_replica``)."""
        return self.trainer_gpus // self.gpus_per_replica

    async def ready(self, timeout_s: float = 300.0) -> None:
        """Wait until both groups are reserved.

        Raises:
            RemoteCallTimeoutError: the cluster lacks the resources (message says which).
        """
        for name, pg in (("trainer", self.trainer), ("standalone", self.standalone)):
            if pg is None:
                continue
            try:
                await await_ref(
                    pg.ready(), timeout_s=timeout_s, what=f"{name} pool", cancel_on_timeout=False
                )
            except RemoteCallTimeoutError:
                available = await asyncio.to_thread(ray.available_resources)
                raise RemoteCallTimeoutError(
                    f"placement group {name} ({pg.bundle_specs}) ready; does the cluster declare"
                    f" enough GPU/CPU resources? available now: {available}",
                    timeout_s,
                ) from None

    def bundle_of(self, pool: Pool, index: int) -> int:
        """Bundle index of trainer worker/GPU ``index`` (trainer) or of replica ``index``.

        For the trainer pool ``index`` is a hybrid replica index when used through
        `hybrid_strategy`; this helper takes the bundle index itself for ``"trainer"``.
        """
        n = self.trainer_gpus if pool == "trainer" else self.standalone_replicas
        if not 0 <= index < n:
            raise IndexError(f"{pool} pool has {n} bundle(s); index {index} is out of range")
        return index

    def _strategy(
        self, pg: PlacementGroup | None, pool: str, bundle: int
    ) -> PlacementGroupSchedulingStrategy:
        if pg is None:
            raise ValueError(f"the {pool} pool is empty: nothing can be placed on it")
        return PlacementGroupSchedulingStrategy(
            placement_group=pg,
            placement_group_bundle_index=bundle,
            placement_group_capture_child_tasks=True,
        )

    def trainer_strategy(self, rank: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy of trainer worker ``rank`` (bundle ``rank``)."""
        return self._strategy(self.trainer, "trainer", self.bundle_of("trainer", rank))

    def hybrid_bundle(self, index: int) -> int:
        """Trainer bundle of hybrid replica ``index`` (its first GPU)."""
        if not 0 <= index < self.hybrid_replicas:
            raise IndexError(
                f"the trainer pool holds {self.hybrid_replicas} hybrid replica(s); index {index} is out of range"
            )
        bundle = replica_placement("hybrid", index, self.gpus_per_replica).bundle
        assert bundle is not None
        return bundle

    def hybrid_strategy(self, index: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy of hybrid replica ``index`` (on the trainer's bundle)."""
        return self._strategy(self.trainer, "trainer", self.hybrid_bundle(index))

    def strategy_of(self, placement: ReplicaPlacement) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy of a replica placed by `replica_placement`."""
        if placement.pool not in ("trainer", "standalone") or placement.bundle is None:
            raise ValueError(
                f"placement must be on a bundle of pool 'trainer' or 'standalone', got {placement!r}"
            )
        pool: Pool = "trainer" if placement.pool == "trainer" else "standalone"
        pg = self.trainer if pool == "trainer" else self.standalone
        return self._strategy(pg, pool, self.bundle_of(pool, placement.bundle))

    def standalone_strategy(self, index: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy of standalone replica ``index`` (its own bundle)."""
        return self._strategy(self.standalone, "standalone", self.bundle_of("standalone", index))

    def ids(self) -> dict[str, str | None]:
        """Hex ids of the placement groups (what an actor reports as its placement group)."""
        return {
            "trainer": self.trainer.id.hex() if self.trainer is not None else None,
            "standalone": self.standalone.id.hex() if self.standalone is not None else None,
        }

    def table(self) -> dict[str, Any]:
        """Ray's description of both groups (bundles, nodes, state)."""
        from ray.util import placement_group_table

        return {
            name: placement_group_table(pg)
            for name, pg in (("trainer", self.trainer), ("standalone", self.standalone))
            if pg is not None
        }

    def remove(self) -> None:
        """Release both reservations (idempotent)."""
        for pg in (self.trainer, self.standalone):
            if pg is not None:
                try:
                    remove_placement_group(pg)
                except Exception:
                    logger.debug("placement group %s already gone", pg.id.hex(), exc_info=True)
