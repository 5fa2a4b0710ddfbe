"""`RayRoleMover`: the core planner's `RoleMover` on Ray (issue 29, item 4).

A move runs at a sync boundary (the loop calls it right after a weight sync, the
trainer idle):

- ``"to_trainer"``: ``replicas`` live standalone replicas are retired through the run's
  `ReplicaSet` the way the controller deactivates a hybrid replica: out of routing, their
  in-flight requests aborted (the retrying rollout client resumes each on another
  replica with the tokens it already has: no sample lost or duplicated), then removed
  from the set for good and their actors stopped; then the trainer group grows by their
  GPUs (`RayTrainerGroup.resize`: the group re-forms, rank 0's model and optimizer state
  reach the new workers, the global batch is kept).
- ``"to_rollout"``: the group shrinks by the GPUs; ``replicas`` standalone replicas start
  from the records of retired ones (same id, bundle of the standalone pool, factory and
  options), join the set, load the current weights before they serve, and are routed.

Ray placement groups are fixed reservations, so the GPUs move between two reservations
sized for the largest trainer (`ResourcePools.trainer_gpus` bundles: `RayTrainerGroup`
``bundles``) and the largest rollout side (the standalone pool's bundles); a trainer
started below its pool (``RayTrainerSpec.workers``) leaves bundles to grow onto. Both
reservations are held for the whole run: on a shared cluster the planner's range costs
that many GPUs (a smaller reservation refuses the move before anything changes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import attrs
from dynsched_core import FullyAsyncLoop, ReplicaSet
from dynsched_core.planner import RoleMove, RoleSplit

from dynsched_ray.runtime.fleet import RayFleet, ReplicaPlan
from dynsched_ray.runtime.proxies import DeathCallback

__all__ = [
    "RayRoleMover",
    "RoleMoveError",
    "install_planner",
    "planner_trainer_workers",
    "with_room_to_grow",
]

logger = logging.getLogger(__name__)


class RoleMoveError(RuntimeError):
    """A role move that cannot run (nothing was changed when it is raised)."""


class RayRoleMover:
    """Moves GPUs between the trainer group and the standalone replicas of a Ray run.

    Args:
        group: The run's `RayTrainerGroup` (data-parallel trainer workers).
        replicas: The run's `ReplicaSet` (the one record of the replicas).
        fleet: The run's `RayFleet` (it starts replica actors from their records).
        weights: ``() -> (version, weights)`` the driver serves now (a started replica
            loads them before it is routed).
        on_death: The run's death callback, for the replicas it starts.
        retire_timeout_s: Bound of one retirement step (unroute, abort).

    Attributes:
        retired: Ids of the standalone replicas it retired, oldest first (a
            ``"to_rollout"`` move starts the most recent ones again).
        history: ``(direction, replicas, seconds)`` of every applied move.
    """

    def __init__(
        self,
        group: Any,
        replicas: ReplicaSet,
        fleet: RayFleet,
        weights: Callable[[], tuple[int, Any]],
        *,
        on_death: DeathCallback | None = None,
        retire_timeout_s: float = 60.0,
    ) -> None:
        self.group = group
        self.replicas = replicas
        self.fleet = fleet
        self._weights = weights
        self._on_death = on_death
        self.retire_timeout_s = float(retire_timeout_s)
        self.retired: list[str] = []
        self.history: list[tuple[str, int, float]] = []

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one rollout replica."""
        return int(self.fleet.spec.gpus_per_replica)

    def split(self) -> RoleSplit:
        """Trainer workers, live standalone replicas, GPUs per replica."""
        return RoleSplit(
            trainer_gpus=len(self.group.workers),
            standalone_replicas=self.replicas.num_standalone,
            gpus_per_replica=self.gpus_per_replica,
        )

    def estimate_s(self, move: RoleMove) -> float:
        """What a move costs before one was measured: 0 (unknown; the planner then
        relies on its own prior)."""
        return 0.0

    def fits(self, move: RoleMove) -> bool:
        """Whether ``move`` fits the current split and the reservations (`move` would not
        refuse it with `RoleMoveError`)."""
        try:
            self._check(move)
        except RoleMoveError:
            return False
        return True

    def _check(self, move: RoleMove) -> int:
        """The trainer size after ``move``; refuses (changing nothing) a move that does
        not fit the current split or the reservations."""
        now = self.split()
        if move.before != now:
            raise RoleMoveError(
                f"RoleMove.before is {move.before}, but the run's split is {now} (a stale move)"
            )
        workers = now.trainer_gpus + (move.gpus if move.direction == "to_trainer" else -move.gpus)
        if not 1 <= workers <= self.group.bundles:
            raise RoleMoveError(
                f"RoleMove {move.direction} x{move.replicas}: the trainer would have {workers} "
                f"worker(s); its pool has bundles for [1, {self.group.bundles}]"
            )
        if move.direction == "to_rollout" and len(self.retired) < move.replicas:
            raise RoleMoveError(
                f"RoleMove to_rollout x{move.replicas}: the standalone pool has "
                f"{len(self.retired)} free bundle(s) (the replicas retired so far)"
            )
        if move.direction == "to_trainer" and now.standalone_replicas < move.replicas:
            raise RoleMoveError(
                f"RoleMove to_trainer x{move.replicas}: only {now.standalone_replicas} live "
                "standalone replica(s)"
            )
        return workers

    async def move(self, move: RoleMove) -> float:
        """Apply ``move`` at a sync boundary (module docstring); seconds it took.

        Raises:
            RoleMoveError: the move does not fit the current split or the reservations
                (nothing changed).
            TrainerResizeError: the trainer is not at a sync boundary (nothing changed).
            TrainerOffloadedError: a trainer worker is offloaded (nothing changed).
        """
        workers = self._check(move)
        self.group.check_resize(workers)  # before any replica is retired
        t0 = time.perf_counter()
        if move.direction == "to_trainer":
            victims = self.replicas.standalone_ids[-move.replicas :]
            for rid in victims:
                await self._retire(rid)
            await self.group.resize(workers)
        else:
            await self.group.resize(workers)
            starting = self.retired[-move.replicas :]
            for rid in reversed(starting):
                await self._start(rid)
        seconds = time.perf_counter() - t0
        self.history.append((move.direction, move.replicas, seconds))
        logger.info("role move %s x%d in %.3f s", move.direction, move.replicas, seconds)
        return seconds

    async def _retire(self, replica_id: str) -> None:
        """Out of routing, requests aborted (resumed elsewhere) until none runs there, out of
        the set, stopped."""
        replica = self.replicas[replica_id]
        handle = getattr(replica, "handle", None)
        await asyncio.wait_for(self.replicas.unroute([replica_id]), self.retire_timeout_s)
        aborted = await asyncio.wait_for(self._drain(replica), self.retire_timeout_s)
        await self.replicas.remove(replica_id)
        self.retired.append(replica_id)
        if handle is not None:
            import ray

            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                logger.debug("replica actor %s already gone", replica_id, exc_info=True)
        logger.info("retired standalone replica %s (%s request(s) aborted)", replica_id, aborted)

    @staticmethod
    async def _drain(replica: Any) -> int:
        """Abort what runs on ``replica`` until nothing does (a request routed just before
        the unroute may start after the first abort); the requests aborted."""
        aborted = 0
        while True:
            aborted += int(await replica.abort(None))
            if not await replica.in_flight():
                return aborted
            await asyncio.sleep(0.05)

    async def _start(self, replica_id: str) -> None:
        """Start a retired replica again from its record, load the current weights, route it."""
        fleet = self.fleet
        record = fleet.record(replica_id)
        if record.placement is None or record.spec is None:
            raise RoleMoveError(f"replica {replica_id!r} has no placement or spec record")
        plan = ReplicaPlan(
            replica_id=replica_id,
            role="standalone",
            placement=attrs.evolve(record.placement, node=""),
            spec=record.spec,
        )
        proxy = await fleet.start_replica(plan, on_death=self._on_death)
        placement = attrs.evolve(plan.placement, node=proxy.capabilities.node or "")
        # a member first, so a weight sync from now on reaches it; then the current weights
        # (a move runs inside the loop's sync step: no newer sync can come meanwhile)
        self.replicas.add(proxy, "standalone", placement=placement, spec=record.spec)
        self.retired.remove(replica_id)
        loaded, weights = self._weights()
        await proxy.update_weights(loaded, weights)
        await self.replicas.route([replica_id])
        logger.info("started standalone replica %s at weights v%d", replica_id, loaded)


def install_planner(planner: Any, runner: Callable[[], Any]) -> Callable[[FullyAsyncLoop], None]:
    """A `RayRunner` ``on_loop_built`` callback that gives the loop ``planner`` and a
    `RayRoleMover` over the run's trainer group, replica set and fleet.

    ``runner`` returns the `RayRunner` (it is built after this callback:
    ``runner = RayRunner(..., on_loop_built=install_planner(planner, lambda: runner))``).
    The loop is given the pair as `FullyAsyncLoop` takes it at construction (it attaches
    the planner to the run's event bus). A decision the reservations cannot hold (more
    trainer workers than the trainer pool has bundles, more replicas than free standalone
    bundles) is dropped (logged): the core planner does not know Ray's reservations.

    Raises:
        RoleMoveError: (when the loop is built) the run has no real trainer group.
    """

    def install(loop: FullyAsyncLoop) -> None:
        run = runner()
        if run.trainer_group is None or run.replicas is None or run.fleet is None:
            raise RoleMoveError(
                "a role planner needs a run with real trainers (RayRunOptions.trainer)"
            )
        mover = RayRoleMover(
            run.trainer_group,
            run.replicas,
            run.fleet,
            weights=_latest_weights(run.trainer_group, loop),
            on_death=getattr(run, "_on_death", None),
        )
        bounded = _WithinReservations(planner, mover)
        # the loop uses the planner's options, attach, observe_batch, decide, record_move:
        # the wrapper has them all (the core planner knows no host ceiling to bound it)
        loop.planner, loop.mover = cast(Any, bounded), mover
        bounded.attach(loop.events, mover.split, mover.estimate_s)

    return install


def _latest_weights(group: Any, loop: FullyAsyncLoop) -> Callable[[], tuple[int, Any]]:
    """``() -> (version, weights)`` of the newest sync: the loop plans right after the
    trainer synced and before the driver records it, so a replica started then loads the
    copy trainer rank 0 keeps (an object ref: it travels from rank 0's node to the
    replica's), else the driver's."""

    def latest() -> tuple[int, Any]:
        version, weights = loop.driver.current_weights
        synced = group.synced_version
        if synced is not None and synced > version:
            ref = group.local_weights([group.gpus[0]], synced)
            if ref is not None:
                return synced, ref
        return version, weights

    return latest


class _WithinReservations:
    """``planner`` whose decisions that do not fit the mover's reservations are dropped."""

    def __init__(self, planner: Any, mover: RayRoleMover) -> None:
        self._planner = planner
        self._mover = mover

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)

    def decide(self, split: RoleSplit, *, now: float) -> RoleMove | None:
        """The planner's move, or None when the reservations cannot hold it."""
        move: RoleMove | None = self._planner.decide(split, now=now)
        if move is not None and not self._mover.fits(move):
            logger.info(
                "role move %s x%d dropped: it does not fit the Ray reservations",
                move.direction,
                move.replicas,
            )
            return None
        return move


def planner_trainer_workers(config: Any) -> int:
    """Trainer workers a planned run starts with: one replica's GPUs below the trainer pool,
    so a planner can grow it (a replica it retires frees a standalone bundle it can give
    back later).

    Raises:
        ConfigError: the trainer pool (``trainer.n_gpus_per_node x nnodes``) is not larger
            than one replica's GPUs, or there is no standalone replica.
    """
    from dynsched_core import ConfigError

    gpr = int(config.rollout_tensor_parallel_size)
    pool = int(config.hybrid_gpus)
    if pool - gpr < 1 or config.num_standalone_replicas < 1:
        raise ConfigError(
            "a role planner on Ray needs trainer GPUs > GPUs per replica (the trainer "
            f"starts {gpr} below its pool to have room to grow; got {pool} trainer GPU(s)) "
            f"and >= 1 standalone replica (got {config.num_standalone_replicas})",
            key="trainer.n_gpus_per_node",
        )
    return pool - gpr


def with_room_to_grow(options: Any, config: Any) -> Any:
    """``options`` (`RayRunOptions` with a ``trainer``) whose trainer starts with
    `planner_trainer_workers` workers.

    Raises:
        ConfigError: no trainer, or see `planner_trainer_workers`.
    """
    from dynsched_core import ConfigError

    if options.trainer is None:
        raise ConfigError("a role planner needs real trainers (RayRunOptions.trainer)")
    workers = planner_trainer_workers(config)
    return attrs.evolve(options, trainer=attrs.evolve(options.trainer, workers=workers))
