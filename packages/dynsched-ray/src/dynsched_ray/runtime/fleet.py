"""`RayFleet`: the actors of one run (router, queue, replicas, trainer workers) on their pools.

`plan_replicas` decides once, from the `FleetSpec`, every replica's id, role, placement
(`replica_placement`: bundle and GPU ids) and spec (factory and options). The fleet
launches the replicas from that plan and writes it into the run's `ReplicaSet`
(`RayFleet.replica_set`, or `RayFleet.attach` for a set built elsewhere); from then on the
set's records are the one source: a respawn reads the record of the dead member, and the
fleet's `replicas` views are the set's members.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import ray
from dynsched_core import EventBus, InMemoryReplica, ReplicaSet
from dynsched_core import validators as v
from dynsched_core._protocols import ReplicaRole
from dynsched_core.rollout import ReplicaMember, ReplicaPlacement, ReplicaSpec

from dynsched_ray.runtime.actors import (
    QueueActor,
    ReplicaActor,
    RouterActor,
    TrainerWorkerActor,
    remote_class,
)
from dynsched_ray.runtime.errors import ActorUnavailableError
from dynsched_ray.runtime.placement import ResourcePools, replica_placement
from dynsched_ray.runtime.proxies import DeathCallback, RayQueue, RayReplica, RayRouter
from dynsched_ray.runtime.remote import await_ref

__all__ = [
    "FleetSpec",
    "RayFleet",
    "ReplicaFactory",
    "ReplicaPlan",
    "default_replica_factory",
    "plan_replicas",
]

logger = logging.getLogger(__name__)

ReplicaFactory = Callable[..., Any]
"""``factory(replica_id, *, role, num_gpus, **replica_kwargs) -> RolloutReplica``, called inside
the replica actor (so it must be importable/picklable, e.g. a class)."""


def default_replica_factory() -> ReplicaFactory:
    """The core's in-memory engine, `dynsched_core.InMemoryReplica` (CPU, real time inside
    the actor)."""
    return InMemoryReplica


@attrs.frozen(kw_only=True)
class FleetSpec:
    """What to start on the Ray cluster.

    Attributes:
        name: Run name; prefixes actor and placement group names. The router actor is
            named ``<name>-router`` in ``namespace`` so a restarted driver finds it.
        namespace: Ray namespace of the named actors (None: the job's namespace).
        trainer_gpus: GPUs of the trainer pool (hybrid replicas are placed there).
        standalone_replicas: Standalone replicas (each on its own bundle).
        hybrid_replicas: Hybrid replicas (<= ``trainer_gpus // gpus_per_replica``).
        gpus_per_replica: GPUs per replica (tensor parallel size).
        trainer_workers: Stand-in trainer worker actors (one per trainer GPU by default
            when None; 0 for none).
        hybrid_gpu_fraction: Share of a trainer GPU a hybrid replica declares; the
            trainer worker on the same GPU declares the rest.
        cpus_per_bundle: CPUs reserved per bundle besides the GPUs.
        placement_strategy: Ray strategy of both placement groups.
        replica_factory: Builds each hosted replica inside its actor (default:
            `InMemoryReplica`).
        standalone_kwargs: Extra keyword arguments of standalone replicas.
        hybrid_kwargs: Extra keyword arguments of hybrid replicas.
        queue_capacity: Sample queue capacity (None: unbounded).
        detached_router: Give the router actor a detached lifetime (it outlives the
            driver process, so a restarted driver reuses it).
        batch_router_calls: Coalesce concurrent acquire/release calls.
        call_timeout_s: Timeout of control calls.
        generate_timeout_s: Timeout of one generation attempt.
        start_timeout_s: Timeout for placement groups and actors to come up.
        trainer_step_time_s: Time of one stand-in training step.
        stream_tokens: Stream generation in segments of this many tokens, so a dying
            replica's tokens are kept (see `RayReplica`); None: one call per attempt.
        restart_queue: Replace a dead queue actor and reload its contents from the
            driver-side journal (`RayQueue`), instead of failing the run.
        restart_router: Replace a dead router actor and re-apply the routable set
            (`RayRouter`), instead of failing the run.
        max_actor_restarts: Replacements allowed for each of the queue and router actors.
    """

    name: str = "dynsched"
    namespace: str | None = None
    trainer_gpus: int = attrs.field(default=2, validator=v.int_ge(0))
    standalone_replicas: int = attrs.field(default=2, validator=v.int_ge(0))
    hybrid_replicas: int | None = None
    gpus_per_replica: int = attrs.field(default=1, validator=v.int_ge(1))
    trainer_workers: int | None = None
    hybrid_gpu_fraction: float = attrs.field(
        default=0.5, validator=v.float_in(0.0, 1.0, lo_open=True)
    )
    cpus_per_bundle: float = 0.0
    placement_strategy: str = "PACK"
    replica_factory: ReplicaFactory | None = None
    standalone_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    hybrid_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    queue_capacity: int | None = None
    detached_router: bool = False
    batch_router_calls: bool = True
    call_timeout_s: float = attrs.field(default=60.0, validator=v.float_gt(0.0))
    generate_timeout_s: float = attrs.field(default=600.0, validator=v.float_gt(0.0))
    start_timeout_s: float = attrs.field(default=300.0, validator=v.float_gt(0.0))
    trainer_step_time_s: float = 0.05
    stream_tokens: int | None = None
    restart_queue: bool = True
    restart_router: bool = True
    max_actor_restarts: int = attrs.field(default=10, validator=v.int_ge(0))

    def __attrs_post_init__(self) -> None:
        most = self.trainer_gpus // self.gpus_per_replica
        if self.hybrid_replicas is not None and not 0 <= self.hybrid_replicas <= most:
            raise ValueError(
                f"hybrid_replicas must be in [0, {most}] (trainer_gpus // gpus_per_replica),"
                f" got {self.hybrid_replicas}"
            )
        if self.trainer_workers is not None and not 0 <= self.trainer_workers <= self.trainer_gpus:
            raise ValueError(
                f"trainer_workers must be in [0, {self.trainer_gpus}] (one per trainer GPU at most),"
                f" got {self.trainer_workers}"
            )

    @property
    def num_hybrid(self) -> int:
        """Hybrid replicas to start."""
        if self.hybrid_replicas is not None:
            return self.hybrid_replicas
        return self.trainer_gpus // self.gpus_per_replica

    @property
    def num_trainer_workers(self) -> int:
        """Trainer worker actors to start."""
        return self.trainer_gpus if self.trainer_workers is None else self.trainer_workers

    @property
    def router_name(self) -> str:
        """Name of the router actor."""
        return f"{self.name}-router"


Role = ReplicaRole


@attrs.frozen(kw_only=True)
class ReplicaPlan:
    """One replica the fleet launches: what `ReplicaSet.add` records about it.

    Attributes:
        replica_id: ``<role>-<index>``.
        role: ``"standalone"`` or ``"hybrid"``.
        placement: Pool, bundle and GPU ids (`replica_placement`).
        spec: The replica factory and its keyword arguments.
    """

    replica_id: str
    role: Role
    placement: ReplicaPlacement
    spec: ReplicaSpec


def plan_replicas(spec: FleetSpec) -> list[ReplicaPlan]:
    """Every replica of ``spec``, standalone first: ids, roles, placements and specs."""
    factory = spec.replica_factory or default_replica_factory()
    groups: tuple[tuple[Role, int, Mapping[str, Any]], ...] = (
        ("standalone", spec.standalone_replicas, spec.standalone_kwargs),
        ("hybrid", spec.num_hybrid, spec.hybrid_kwargs),
    )
    return [
        ReplicaPlan(
            replica_id=f"{role}-{index}",
            role=role,
            placement=replica_placement(role, index, spec.gpus_per_replica),
            spec=ReplicaSpec(
                factory=factory,
                options={"role": role, "num_gpus": spec.gpus_per_replica, **extra},
            ),
        )
        for role, count, extra in groups
        for index in range(count)
    ]


def _proxy(replica: Any) -> Any:
    """The Ray proxy under a wrapper (e.g. a `HandOverReplica`)."""
    return getattr(replica, "inner", replica)


def _placed(placement: ReplicaPlacement | None, proxy: RayReplica) -> ReplicaPlacement | None:
    """``placement`` on the node ``proxy``'s actor runs on."""
    if placement is None:
        return None
    return attrs.evolve(placement, node=proxy.capabilities.node or placement.node)


@attrs.define
class RayFleet:
    """Handles and proxies of a launched fleet; build with `RayFleet.launch`.

    Attributes:
        spec: What was launched.
        pools: The placement groups.
        router: Driver-side router proxy.
        router_reused: True when an existing named router actor was found and reused.
        queue: Driver-side sample queue proxy.
        launched: The replica proxies as launched, by id (standalone first); the run's
            `ReplicaSet` (`members`) is the record from then on.
        trainer_workers: Handles of the stand-in trainer workers.
        plan: The replicas planned by `plan_replicas`.
        members: The run's `ReplicaSet`, once `replica_set` built it or `attach` was
            called (the fleet's replica views and respawns read it).
    """

    spec: FleetSpec
    pools: ResourcePools
    router: RayRouter
    router_reused: bool
    queue: RayQueue
    launched: dict[str, RayReplica]
    trainer_workers: list[Any]
    plan: tuple[ReplicaPlan, ...] = ()
    members: ReplicaSet | None = None
    _handles: list[Any] = attrs.field(factory=list)
    #: Proxies of replica actors replaced by `respawn_replica` (their records stay readable).
    retired: list[RayReplica] = attrs.field(factory=list, init=False)

    @property
    def replicas(self) -> dict[str, RayReplica]:
        """Every replica proxy by id (standalone first), dead ones included: the current
        member of each id of `members` (the launched proxies before a set is attached)."""
        if self.members is None:
            return dict(self.launched)
        current = {
            m.replica_id: _proxy(m.replica)
            for m in self.members.members()
            if m.replica_id in self.launched
        }
        return {rid: current[rid] for rid in self.launched if rid in current}

    @property
    def standalone(self) -> dict[str, RayReplica]:
        """The standalone replica proxies by id (see `replicas`)."""
        return {rid: r for rid, r in self.replicas.items() if self.role_of(rid) == "standalone"}

    @property
    def hybrid(self) -> dict[str, RayReplica]:
        """The hybrid replica proxies by id (see `replicas`)."""
        return {rid: r for rid, r in self.replicas.items() if self.role_of(rid) == "hybrid"}

    def record(self, replica_id: str) -> ReplicaMember | ReplicaPlan:
        """The record of ``replica_id``: its member in `members`, or its plan before a set
        is attached.

        Raises:
            KeyError: not one of this fleet's replicas.
        """
        if replica_id not in self.launched:
            raise KeyError(f"{replica_id!r} is not a replica of fleet {self.spec.name!r}")
        if self.members is not None:
            try:
                return self.members.member(replica_id)
            except KeyError:
                pass  # removed from the set for good: its plan still says what it was
        return next(p for p in self.plan if p.replica_id == replica_id)

    def role_of(self, replica_id: str) -> Role:
        """``"standalone"`` or ``"hybrid"``."""
        return self.record(replica_id).role

    def placement_of(self, replica_id: str) -> ReplicaPlacement:
        """Where ``replica_id`` runs (pool, bundle, GPU ids, node), from its record."""
        placement = self.record(replica_id).placement
        if placement is None:
            raise KeyError(f"replica {replica_id!r} has no placement record")
        return placement

    def replica_set(
        self, *, hybrid: Mapping[str, Any] | None = None, events: EventBus | None = None
    ) -> ReplicaSet:
        """The run's `ReplicaSet` over this fleet's replicas, with their records; the
        router follows it, and the fleet reads it from now on (`attach`).

        Args:
            hybrid: Replicas to register instead of the plain hybrid proxies (the run's
                wrappers, e.g. `HandOverReplica`), by id.
            events: Bus that also receives every membership event.
        """
        wrapped = dict(hybrid or {})
        replicas = ReplicaSet(self.router, events=events)
        for plan in self.plan:
            proxy = self.launched[plan.replica_id]
            replicas.add(
                wrapped.get(plan.replica_id, proxy),
                plan.role,
                placement=_placed(plan.placement, proxy),
                spec=plan.spec,
            )
        self.attach(replicas)
        for rid, proxy in self.launched.items():
            if proxy.is_dead:  # died before the set existed
                replicas.mark_dead(rid)
        return replicas

    def attach(self, replicas: ReplicaSet) -> None:
        """Make ``replicas`` this fleet's record: members it launched that lack a record
        get their plan's; router recovery re-applies its routable set (idempotent)."""
        known = {m.replica_id: m for m in replicas.members()}
        for plan in self.plan:
            member = known.get(plan.replica_id)
            if member is not None and member.placement is None:
                proxy = _proxy(member.replica)
                replicas.set_record(
                    plan.replica_id, placement=_placed(plan.placement, proxy), spec=plan.spec
                )
        self.members = replicas
        self.router.follow(replicas)

    @classmethod
    async def launch(cls, spec: FleetSpec, *, on_death: DeathCallback | None = None) -> RayFleet:
        """Reserve the pools, start (or find) the actors and wait until they answer.

        Args:
            spec: What to start.
            on_death: Called once per replica whose actor is found dead.

        Raises:
            RemoteCallTimeoutError: resources or actors did not come up in time.
        """
        if not ray.is_initialized():
            raise RuntimeError(
                "Ray is not initialised: call ray.init() (or ray.init(address='auto') to join a"
                " cluster started with `ray start --head`) before launching a fleet"
            )
        pools = ResourcePools.create(
            trainer_gpus=spec.trainer_gpus,
            standalone_replicas=spec.standalone_replicas,
            gpus_per_replica=spec.gpus_per_replica,
            cpus_per_bundle=spec.cpus_per_bundle,
            strategy=spec.placement_strategy,
            name_prefix=spec.name,
        )
        handles: list[Any] = []
        plan = tuple(plan_replicas(spec))
        try:
            await pools.ready(spec.start_timeout_s)
            router, reused = await _attach_router(spec)
            queue_handle = await _spawn_queue(spec, handles)
            replica_handles = [await _spawn_replica(spec, pools, p, handles) for p in plan]
            workers = await _spawn_trainer_workers(spec, pools, handles)
            proxies = await asyncio.gather(
                *(_connect(spec, h, on_death, spec.start_timeout_s) for h in replica_handles)
            )
            await _await_ready(spec, queue_handle, workers)
        except BaseException:
            for h in handles:
                _kill(h)
            pools.remove()
            raise
        fleet = cls(
            spec=spec,
            pools=pools,
            router=router,
            router_reused=reused,
            queue=RayQueue(
                queue_handle,
                call_timeout_s=spec.call_timeout_s,
                capacity=spec.queue_capacity,
                name=f"{spec.name}-queue",
            ),
            launched={r.replica_id: r for r in proxies},
            trainer_workers=workers,
            plan=plan,
            handles=[*handles, router.handle],
        )
        if spec.restart_queue:
            fleet.queue.respawn = fleet.respawn_queue
            fleet.queue.max_restarts = spec.max_actor_restarts
        if spec.restart_router:
            fleet.router.respawn = fleet.respawn_router
            fleet.router.max_restarts = spec.max_actor_restarts
        logger.info(
            "fleet %s up: %d standalone, %d hybrid replica(s), %d trainer worker(s), router %s",
            spec.name,
            len(fleet.standalone),
            len(fleet.hybrid),
            len(workers),
            "reused" if reused else "created",
        )
        return fleet

    async def trainer_placements(self) -> list[dict[str, Any]]:
        """Placement of each trainer worker (see `placement_info`)."""
        out = await asyncio.gather(
            *(
                await_ref(
                    w.describe.remote(), timeout_s=self.spec.call_timeout_s, what="trainer.describe"
                )
                for w in self.trainer_workers
            )
        )
        return [d["placement"] for d in out]

    async def stop_replicas(self, timeout_s: float = 60.0) -> None:
        """Ask every live replica actor to shut its replica down (engines and their
        processes), each bounded by ``timeout_s``; failures are logged, not raised."""

        async def stop(rep: RayReplica) -> None:
            if rep.is_dead:
                return
            try:
                await await_ref(
                    rep.handle.shutdown.remote(),
                    timeout_s=timeout_s,
                    what=f"replica[{rep.replica_id}].shutdown",
                )
            except Exception as exc:
                logger.warning("replica %s did not shut down cleanly: %r", rep.replica_id, exc)

        await asyncio.gather(*(stop(r) for r in self.replicas.values()))

    async def ping_replicas(self, timeout_s: float) -> None:
        """Ping the live replicas' actors, in parallel (health check): a proxy that finds
        its actor dead reports the death (its ``on_death``, which marks it in the set)."""
        live = [
            proxy
            for rid, proxy in self.replicas.items()
            if (self.members.is_alive(rid) if self.members is not None else not proxy.is_dead)
        ]
        await asyncio.gather(*(p.ping(timeout_s=timeout_s) for p in live), return_exceptions=True)

    def kill_replica(self, replica_id: str) -> None:
        """Kill a replica's actor (fault injection for tests and drills)."""
        ray.kill(self.replicas[replica_id].handle, no_restart=True)

    async def respawn_replica(
        self,
        replica_id: str,
        *,
        on_death: DeathCallback | None = None,
        timeout_s: float | None = None,
    ) -> RayReplica:
        """Start a fresh actor for ``replica_id`` from its record and connect to it.

        The fresh replica has the same id, role, bundle and spec (Ray reschedules a bundle
        whose node was lost, when the cluster has room for it); it is not a member of the
        `ReplicaSet` yet: the caller re-registers and warms it (see `ReplicaSupervisor`),
        and the fleet's views show it from then on.

        Raises:
            KeyError: ``replica_id`` is not one of this fleet's replicas.
            RemoteCallTimeoutError: the actor did not come up within ``timeout_s``.
        """
        record = self.record(replica_id)
        if record.placement is None or record.spec is None:
            raise KeyError(f"replica {replica_id!r} has no placement or spec record")
        old = self.replicas[replica_id]
        _kill(old.handle)  # a hung (not dead) actor must not hold the name and bundle
        plan = ReplicaPlan(
            replica_id=replica_id, role=record.role, placement=record.placement, spec=record.spec
        )
        proxy = await self.start_replica(plan, on_death=on_death, timeout_s=timeout_s)
        if old.handle in self._handles:
            self._handles.remove(old.handle)
        self.retired.append(old)
        return proxy

    async def start_replica(
        self,
        plan: ReplicaPlan,
        *,
        on_death: DeathCallback | None = None,
        timeout_s: float | None = None,
    ) -> RayReplica:
        """Start the actor of ``plan`` on its bundle and connect to it.

        The replica is not a member of the `ReplicaSet` yet: the caller adds it (with the
        placement the proxy reports), loads weights and routes it (see `RayRoleMover`).

        Raises:
            RemoteCallTimeoutError: the actor did not come up within ``timeout_s``
                (default: the fleet's ``start_timeout_s``); the actor is killed.
        """
        limit = self.spec.start_timeout_s if timeout_s is None else timeout_s
        spec = attrs.evolve(self.spec, start_timeout_s=limit)
        handle = await _spawn_replica(spec, self.pools, plan, self._handles)
        try:
            return await _connect(spec, handle, on_death, limit)
        except BaseException:
            _kill(handle)
            raise

    async def respawn_queue(self) -> Any:
        """Start a fresh, empty queue actor under the queue's name; return its handle.

        Used by `RayQueue` when its actor died (it then reloads its journal into it).
        """
        _kill(self.queue.handle)
        handle = await _spawn_queue(self.spec, self._handles)
        await await_ref(
            handle.ping.remote(), timeout_s=self.spec.start_timeout_s, what="queue.ping"
        )
        return handle

    async def respawn_router(self) -> Any:
        """Start a fresh router actor under the router's name; return its handle.

        Used by `RayRouter` when its actor died (it then re-applies its routable set).
        """
        _kill(self.router.handle)
        handle = await _new_router_actor(self.spec)
        self._handles.append(handle)
        _KEPT_ROUTERS.pop((self.spec.namespace, self.spec.router_name), None)
        return handle

    def shutdown(self, *, keep_router: bool = False) -> None:
        """Kill the actors (the router too unless ``keep_router``) and free the pools."""
        router_handle = self.router.handle
        key = (self.spec.namespace, self.spec.router_name)
        for h in self._handles:
            if keep_router and h is router_handle:
                continue
            _kill(h)
        if keep_router and not self.spec.detached_router:
            # A non-detached actor lives while a handle to it does: keep one in this
            # process until a later fleet reuses (or rebuilds) the router, or else the
            # router may be collected between two runs (seen as ActorDiedError when the
            # next run reuses it).
            _KEPT_ROUTERS[key] = router_handle
        else:
            _KEPT_ROUTERS.pop(key, None)
        self.pools.remove()


async def _spawn_queue(spec: FleetSpec, handles: list[Any]) -> Any:
    handle = await _spawn(
        QueueActor,
        {"num_cpus": 0, "name": f"{spec.name}-queue", "namespace": spec.namespace},
        spec.queue_capacity,
        timeout_s=spec.start_timeout_s,
    )
    handles.append(handle)
    return handle


async def _spawn_replica(
    spec: FleetSpec, pools: ResourcePools, plan: ReplicaPlan, handles: list[Any]
) -> Any:
    """Start the actor of ``plan`` on its bundle (recorded in ``handles``)."""
    hybrid = plan.role == "hybrid"
    options = {
        "num_cpus": 0,
        "num_gpus": spec.hybrid_gpu_fraction if hybrid else spec.gpus_per_replica,
        "scheduling_strategy": pools.strategy_of(plan.placement),
        "name": f"{spec.name}-{plan.replica_id}",
        "namespace": spec.namespace,
    }
    handle = await _spawn(
        ReplicaActor,
        options,
        plan.spec.factory,
        (plan.replica_id,),
        dict(plan.spec.options),
        spec.stream_tokens or 16,
        timeout_s=spec.start_timeout_s,
    )
    handles.append(handle)
    return handle


async def _spawn_trainer_workers(
    spec: FleetSpec, pools: ResourcePools, handles: list[Any]
) -> list[Any]:
    """One stand-in trainer worker per trainer GPU (sharing it with a hybrid replica)."""
    fraction = 1.0 - spec.hybrid_gpu_fraction if spec.num_hybrid else 1.0
    workers = []
    for rank in range(spec.num_trainer_workers):
        options: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": pools.trainer_strategy(rank),
            "name": f"{spec.name}-trainer-{rank}",
            "namespace": spec.namespace,
        }
        if fraction > 0:
            options["num_gpus"] = fraction
        worker = await _spawn(
            TrainerWorkerActor,
            options,
            rank,
            spec.trainer_step_time_s,
            timeout_s=spec.start_timeout_s,
        )
        handles.append(worker)
        workers.append(worker)
    return workers


async def _connect(
    spec: FleetSpec, handle: Any, on_death: DeathCallback | None, timeout_s: float
) -> RayReplica:
    """Wait for a replica actor to answer and build its proxy."""
    return await RayReplica.connect(
        handle,
        timeout_s=timeout_s,
        call_timeout_s=spec.call_timeout_s,
        generate_timeout_s=spec.generate_timeout_s,
        on_death=on_death,
        stream=spec.stream_tokens is not None,
    )


async def _await_ready(spec: FleetSpec, queue: Any, workers: list[Any]) -> None:
    """Wait until the queue and every trainer worker answer."""
    t = spec.start_timeout_s
    await asyncio.gather(
        await_ref(queue.ping.remote(), timeout_s=t, what="queue.ping"),
        *(await_ref(w.describe.remote(), timeout_s=t, what="trainer.describe") for w in workers),
    )


async def _spawn(cls: type, options: dict[str, Any], *args: Any, timeout_s: float) -> Any:
    """Create a (named) actor; wait while the name of a just-killed one is released."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return remote_class(cls).options(**options).remote(*args)
        except ValueError:
            if "name" not in options or loop.time() > deadline:
                raise
            logger.debug("actor name %s still taken; retrying", options["name"])
            await asyncio.sleep(0.1)


#: Routers kept alive by `RayFleet.shutdown(keep_router=True)`: (namespace, name) -> handle.
_KEPT_ROUTERS: dict[tuple[str | None, str], Any] = {}


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        logger.debug("actor already gone", exc_info=True)


async def _attach_router(spec: FleetSpec) -> tuple[RayRouter, bool]:
    """The run's router proxy, routing nothing yet, and whether its actor was reused.

    A reused router may still route a previous run's replicas, so it starts from an empty
    routable set (the run's `ReplicaSet` routes its standalone replicas when the loop
    starts). A named actor that answered the liveness ping may still be on its way out
    (``ray.kill`` is asynchronous): when that first real call finds it dead, a fresh
    router is built under the same name.
    """
    handle, reused = await _router_actor(spec)
    router = _router_proxy(spec, handle)
    try:
        await router.set_routable([])
    except ActorUnavailableError as exc:
        if not reused:
            raise
        logger.warning(
            "reused router %s died before use (%r); rebuilding it", spec.router_name, exc
        )
        _kill(handle)
        handle, reused = await _new_router_actor(spec), False
        router = _router_proxy(spec, handle)
        await router.set_routable([])
    return router, reused


def _router_proxy(spec: FleetSpec, handle: Any) -> RayRouter:
    return RayRouter(
        handle,
        call_timeout_s=spec.call_timeout_s,
        batch=spec.batch_router_calls,
        name=spec.router_name,
    )


async def _router_actor(spec: FleetSpec) -> tuple[Any, bool]:
    """Find the named router (reuse it when it answers) or create it."""
    kept = _KEPT_ROUTERS.pop((spec.namespace, spec.router_name), None)
    try:
        handle = await asyncio.to_thread(ray.get_actor, spec.router_name, namespace=spec.namespace)
    except ValueError:
        handle = None
    if handle is None and kept is not None:
        handle = kept
    del kept  # the fleet's own handle keeps it alive from here on
    if handle is not None:
        try:
            await await_ref(handle.ping.remote(), timeout_s=spec.call_timeout_s, what="router.ping")
            logger.info("reusing router actor %s", spec.router_name)
            return handle, True
        except Exception as exc:
            logger.warning(
                "named router %s does not answer (%r); rebuilding it", spec.router_name, exc
            )
            _kill(handle)
    return await _new_router_actor(spec), False


async def _new_router_actor(spec: FleetSpec) -> Any:
    opts: dict[str, Any] = {"num_cpus": 0, "name": spec.router_name, "namespace": spec.namespace}
    if spec.detached_router:
        opts["lifetime"] = "detached"
    handle = await _spawn(RouterActor, opts, timeout_s=spec.start_timeout_s)
    await await_ref(handle.ping.remote(), timeout_s=spec.start_timeout_s, what="router.ping")
    return handle
