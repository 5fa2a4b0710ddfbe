"""`ReplicaSupervisor`: replaces dead replica actors during a run.

A replica found dead is marked dead in the run's `ReplicaSet` (the one owner of
membership and of each replica's record) by the runner. The supervisor hears of it there
and, within its budget of restarts, starts a fresh actor from the dead member's record
(same id, bundle, GPU ids, factory and options: `RayFleet.respawn_replica`), then
re-registers and warms it through the `ReplicaSet`, where it keeps that record:

- a standalone replica joins the set (not routable), loads the current weights (the
  version and weights of the last sync, read when it is ready), and only then is routed;
  a weight sync that happened meanwhile is caught up before routing;
- a hybrid replica joins the set asleep and unrouted; the controller wakes it with the
  current weights at its next activation (or a failover), like its siblings.

Each attempt is bounded (``restart_timeout_s``); a restart that cannot be placed (e.g. its
node is gone and the cluster has no room) is given up after its attempts and reported.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import attrs
from dynsched_core import ReplicaSet
from dynsched_core import validators as v
from dynsched_core.events import MembershipEvent

from dynsched_ray.runtime.fleet import RayFleet
from dynsched_ray.runtime.proxies import DeathCallback, RayReplica

__all__ = ["ReplicaRestart", "ReplicaSupervisor", "RestartOptions"]

logger = logging.getLogger(__name__)

WeightsSource = Callable[[], tuple[int, Any]]
"""``() -> (version, weights)``: the weights replicas must serve now."""


@attrs.frozen(kw_only=True)
class RestartOptions:
    """How dead replica actors are replaced.

    Attributes:
        max_restarts: Restarts per replica id over the run (0: never restart).
        restart_delay_s: Pause before a restart (lets Ray release the name and bundle).
        restart_timeout_s: Bound of one attempt (placement, start, warm-up).
        attempts: Attempts per restart before giving up.
    """

    max_restarts: int = attrs.field(default=3, validator=v.int_ge(0))
    restart_delay_s: float = attrs.field(default=0.2, validator=v.float_ge(0.0))
    restart_timeout_s: float = attrs.field(default=60.0, validator=v.float_gt(0.0))
    attempts: int = attrs.field(default=2, validator=v.int_ge(1))


@attrs.frozen(kw_only=True)
class ReplicaRestart:
    """One restart of a dead replica.

    Attributes:
        replica_id: The replica.
        role: ``"standalone"`` or ``"hybrid"``.
        died_at: Loop time the death was recorded.
        ready_at: Loop time the fresh replica was registered (and routed, for a
            standalone one); None when the restart failed.
        attempts: Attempts made.
        version: Weight version the fresh replica was warmed with (None for a hybrid
            replica, warmed at its next activation).
        error: Why it failed (empty on success).
    """

    replica_id: str
    role: str
    died_at: float
    ready_at: float | None
    attempts: int
    version: int | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        """The replica is back."""
        return self.ready_at is not None

    @property
    def downtime_s(self) -> float | None:
        """Seconds from the death to the fresh replica being ready."""
        return None if self.ready_at is None else self.ready_at - self.died_at


class ReplicaSupervisor:
    """Replaces the dead replica actors of a fleet, through the run's `ReplicaSet`.

    Args:
        fleet: The fleet whose actors are replaced.
        replicas: The run's `ReplicaSet`.
        weights: Returns the ``(version, weights)`` a replica must serve now.
        options: Restart budget and bounds.
        on_death: Death callback of the fresh proxies (the runner's, which marks them
            dead in the set).
        wrap_hybrid: Wraps a fresh hybrid proxy the way the run wraps its hybrid
            replicas (e.g. in a `HandOverReplica` with real trainers; its GPU ids are
            ``replicas.placement_of(proxy.replica_id).gpu_ids``).
        progress: Called with one line per restart.
    """

    def __init__(
        self,
        fleet: RayFleet,
        replicas: ReplicaSet,
        *,
        weights: WeightsSource,
        options: RestartOptions | None = None,
        on_death: DeathCallback | None = None,
        wrap_hybrid: Callable[[RayReplica], Any] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.replicas = replicas
        self.options = v.options_or_default(options, RestartOptions)
        self._weights = weights
        self._on_death = on_death
        self._wrap_hybrid = wrap_hybrid
        self._progress = progress
        self._restarts: dict[str, int] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.history: list[ReplicaRestart] = []
        self._unsubscribe: Callable[[], None] | None = None
        fleet.attach(replicas)  # the fleet respawns from (and shows) this set's records

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Listen to the set's deaths (idempotent); replicas already dead are restarted."""
        if self._unsubscribe is None:
            self._unsubscribe = self.replicas.subscribe(self._on_membership)
            for rid in self.replicas.dead_ids:
                self._schedule(rid)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop listening and cancel restarts in progress (bounded)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    @property
    def pending(self) -> list[str]:
        """Replicas being restarted now."""
        return sorted(rid for rid, t in self._tasks.items() if not t.done())

    def can_restart(self, replica_id: str) -> bool:
        """A restart of ``replica_id`` is within the budget."""
        return self._restarts.get(replica_id, 0) < self.options.max_restarts

    def can_restart_any(self) -> bool:
        """A restart of some member of the set (alive or dead) is within the budget."""
        return any(self.can_restart(m.replica_id) for m in self.replicas.members())

    # ------------------------------------------------------------------ internals
    def _say(self, line: str) -> None:
        logger.info(line)
        if self._progress is not None:
            try:
                self._progress(line)
            except Exception:
                logger.exception("progress callback failed")

    def _on_membership(self, event: MembershipEvent) -> None:
        if event.kind == "died":
            for rid in event.replica_ids:
                self._schedule(rid)

    def _schedule(self, replica_id: str) -> None:
        if replica_id in self._tasks and not self._tasks[replica_id].done():
            return
        if not self.can_restart(replica_id):
            logger.warning("replica %s: no restart left; it stays dead", replica_id)
            return
        if replica_id not in self.fleet.replicas:
            return
        self._restarts[replica_id] = self._restarts.get(replica_id, 0) + 1
        loop = asyncio.get_running_loop()
        self._tasks[replica_id] = loop.create_task(
            self._restart(replica_id, loop.time()), name=f"restart-{replica_id}"
        )

    async def _restart(self, replica_id: str, died_at: float) -> None:
        loop = asyncio.get_running_loop()
        role = self.replicas.role_of(replica_id)
        error = ""
        version: int | None = None
        ready_at: float | None = None
        attempt = 0
        for attempt in range(1, self.options.attempts + 1):
            await asyncio.sleep(self.options.restart_delay_s)
            try:
                version = await asyncio.wait_for(
                    self._bring_back(replica_id, role), self.options.restart_timeout_s
                )
            except Exception as exc:  # a cancellation (BaseException) goes through
                error = f"{type(exc).__name__}: {exc}"
                logger.warning("restart of %s, attempt %d failed: %s", replica_id, attempt, error)
                continue
            ready_at, error = loop.time(), ""
            break
        record = ReplicaRestart(
            replica_id=replica_id,
            role=role,
            died_at=died_at,
            ready_at=ready_at,
            attempts=attempt,
            version=version,
            error=error,
        )
        self.history.append(record)
        if record.downtime_s is None:
            self._say(f"replica {replica_id} could not be restarted: {error}")
            return
        weights = f", weights v{version})" if version is not None else ")"
        self._say(
            f"replica {replica_id} restarted ({role}, attempt {attempt},"
            f" {record.downtime_s:.2f} s down{weights}"
        )

    async def _bring_back(self, replica_id: str, role: str) -> int | None:
        """Start, register and warm a fresh replica; return the version it serves."""
        proxy = await self.fleet.respawn_replica(
            replica_id, on_death=self._on_death, timeout_s=self.options.restart_timeout_s
        )
        if self.replicas.is_alive(replica_id):  # someone else registered it meanwhile
            return None
        record = self.replicas.member(replica_id).placement
        # same pool, bundle and GPU ids; the node is wherever Ray placed the bundle now
        placement = None if record is None else attrs.evolve(record, node=proxy.capabilities.node)
        if role == "hybrid":
            await proxy.sleep()  # like its siblings: asleep until the next activation
            replica = self._wrap_hybrid(proxy) if self._wrap_hybrid is not None else proxy
            self.replicas.add(replica, "hybrid", placement=placement)
            return None
        # standalone: a member first (so a weight sync from now on reaches it), warm, route
        self.replicas.add(proxy, "standalone", placement=placement)
        loaded = -1
        while True:
            version, weights = self._weights()
            if version == loaded:
                break
            await proxy.update_weights(version, weights)
            loaded = version
            if not self.replicas.is_routable(replica_id):
                await self.replicas.route([replica_id])
        return loaded
