"""`RayFleet`: the actors of one run (router, queue, replicas, trainer workers) on their pools."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import ray

from dynsched_ray._actors import (
    QueueActor,
    ReplicaActor,
    RouterActor,
    TrainerWorkerActor,
    remote_class,
)
from dynsched_ray._placement import ResourcePools
from dynsched_ray._proxies import DeathCallback, RayQueue, RayReplica, RayRouter
from dynsched_ray._remote import await_ref

__all__ = ["FleetSpec", "RayFleet", "ReplicaFactory", "default_replica_factory"]

logger = logging.getLogger(__name__)

ReplicaFactory = Callable[..., Any]
"""``factory(replica_id, *, role, num_gpus, **replica_kwargs) -> RolloutReplica``, called inside
the replica actor (so it must be importable/picklable, e.g. a class)."""


def default_replica_factory() -> ReplicaFactory:
    """The in-memory replica of ``dynsched_core.testing`` (CPU, real time inside the actor)."""
    from dynsched_core.testing import InMemoryReplica

    return InMemoryReplica


def _frac(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"{attr.name} must be a number in (0, 1], got {value!r}")


def _pos(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attr.name} must be a number > 0, got {value!r}")


def _nonneg_int(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attr.name} must be an int >= 0, got {value!r}")


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
    """

    name: str = "dynsched"
    namespace: str | None = None
    trainer_gpus: int = attrs.field(default=2, validator=_nonneg_int)
    standalone_replicas: int = attrs.field(default=2, validator=_nonneg_int)
    hybrid_replicas: int | None = None
    gpus_per_replica: int = attrs.field(default=1, validator=_nonneg_int)
    trainer_workers: int | None = None
    hybrid_gpu_fraction: float = attrs.field(default=0.5, validator=_frac)
    cpus_per_bundle: float = 0.0
    placement_strategy: str = "PACK"
    replica_factory: ReplicaFactory | None = None
    standalone_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    hybrid_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    queue_capacity: int | None = None
    detached_router: bool = False
    batch_router_calls: bool = True
    call_timeout_s: float = attrs.field(default=60.0, validator=_pos)
    generate_timeout_s: float = attrs.field(default=600.0, validator=_pos)
    start_timeout_s: float = attrs.field(default=300.0, validator=_pos)
    trainer_step_time_s: float = 0.05
    stream_tokens: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.gpus_per_replica < 1:
            raise ValueError(f"gpus_per_replica must be an int >= 1, got {self.gpus_per_replica}")
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


@attrs.define
class RayFleet:
    """Handles and proxies of a launched fleet; build with `RayFleet.launch`.

    Attributes:
        spec: What was launched.
        pools: The placement groups.
        router: Driver-side router proxy.
        router_reused: True when an existing named router actor was found and reused.
        queue: Driver-side sample queue proxy.
        standalone: Standalone replica proxies by id.
        hybrid: Hybrid replica proxies by id.
        trainer_workers: Handles of the stand-in trainer workers.
    """

    spec: FleetSpec
    pools: ResourcePools
    router: RayRouter
    router_reused: bool
    queue: RayQueue
    standalone: dict[str, RayReplica]
    hybrid: dict[str, RayReplica]
    trainer_workers: list[Any]
    _handles: list[Any] = attrs.field(factory=list)

    @property
    def replicas(self) -> dict[str, RayReplica]:
        """Every replica by id (standalone first)."""
        return {**self.standalone, **self.hybrid}

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
        try:
            await pools.ready(spec.start_timeout_s)
            router_handle, reused = await _router_actor(spec)
            t = spec.start_timeout_s
            queue_handle = await _spawn(
                QueueActor,
                {"num_cpus": 0, "name": f"{spec.name}-queue", "namespace": spec.namespace},
                spec.queue_capacity,
                timeout_s=t,
            )
            handles.append(queue_handle)
            factory = spec.replica_factory or default_replica_factory()
            seg = spec.stream_tokens or 16
            standalone_handles: list[Any] = []
            opts: dict[str, Any]
            for i in range(spec.standalone_replicas):
                rid = f"standalone-{i}"
                kwargs = {
                    "role": "standalone",
                    "num_gpus": spec.gpus_per_replica,
                    **spec.standalone_kwargs,
                }
                opts = {
                    "num_cpus": 0,
                    "num_gpus": spec.gpus_per_replica,
                    "scheduling_strategy": pools.standalone_strategy(i),
                    "name": f"{spec.name}-{rid}",
                    "namespace": spec.namespace,
                }
                h = await _spawn(ReplicaActor, opts, factory, (rid,), kwargs, seg, timeout_s=t)
                handles.append(h)
                standalone_handles.append(h)
            hybrid_handles: list[Any] = []
            for i in range(spec.num_hybrid):
                rid = f"hybrid-{i}"
                kwargs = {"role": "hybrid", "num_gpus": spec.gpus_per_replica, **spec.hybrid_kwargs}
                opts = {
                    "num_cpus": 0,
                    "num_gpus": spec.hybrid_gpu_fraction,
                    "scheduling_strategy": pools.hybrid_strategy(i),
                    "name": f"{spec.name}-{rid}",
                    "namespace": spec.namespace,
                }
                h = await _spawn(ReplicaActor, opts, factory, (rid,), kwargs, seg, timeout_s=t)
                handles.append(h)
                hybrid_handles.append(h)
            trainer_fraction = 1.0 - spec.hybrid_gpu_fraction if spec.num_hybrid else 1.0
            workers: list[Any] = []
            for rank in range(spec.num_trainer_workers):
                opts = {
                    "num_cpus": 0,
                    "scheduling_strategy": pools.trainer_strategy(rank),
                    "name": f"{spec.name}-trainer-{rank}",
                    "namespace": spec.namespace,
                }
                if trainer_fraction > 0:
                    opts["num_gpus"] = trainer_fraction
                w = await _spawn(
                    TrainerWorkerActor, opts, rank, spec.trainer_step_time_s, timeout_s=t
                )
                handles.append(w)
                workers.append(w)

            kw: dict[str, Any] = {
                "timeout_s": spec.start_timeout_s,
                "call_timeout_s": spec.call_timeout_s,
                "generate_timeout_s": spec.generate_timeout_s,
                "on_death": on_death,
                "stream": spec.stream_tokens is not None,
            }
            standalone_list, hybrid_list = await asyncio.gather(
                asyncio.gather(*(RayReplica.connect(h, **kw) for h in standalone_handles)),
                asyncio.gather(*(RayReplica.connect(h, **kw) for h in hybrid_handles)),
            )
            await asyncio.gather(
                await_ref(
                    queue_handle.ping.remote(), timeout_s=spec.start_timeout_s, what="queue.ping"
                ),
                *(
                    await_ref(
                        w.describe.remote(), timeout_s=spec.start_timeout_s, what="trainer.describe"
                    )
                    for w in workers
                ),
            )
        except BaseException:
            for h in handles:
                _kill(h)
            pools.remove()
            raise
        router = RayRouter(
            router_handle,
            call_timeout_s=spec.call_timeout_s,
            batch=spec.batch_router_calls,
            name=spec.router_name,
        )
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
            standalone={r.replica_id: r for r in standalone_list},
            hybrid={r.replica_id: r for r in hybrid_list},
            trainer_workers=workers,
            handles=[*handles, router_handle],
        )
        # A (re)started run begins with the standalone replicas routable, hybrid asleep.
        await router.set_routable(sorted(fleet.standalone))
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

    def kill_replica(self, replica_id: str) -> None:
        """Kill a replica's actor (fault injection for tests and drills)."""
        ray.kill(self.replicas[replica_id].handle, no_restart=True)

    def shutdown(self, *, keep_router: bool = False) -> None:
        """Kill the actors (the router too unless ``keep_router``) and free the pools."""
        router_handle = self.router.handle
        for h in self._handles:
            if keep_router and h is router_handle:
                continue
            _kill(h)
        self.pools.remove()


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


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        logger.debug("actor already gone", exc_info=True)


async def _router_actor(spec: FleetSpec) -> tuple[Any, bool]:
    """Find the named router (reuse it when it answers) or create it."""
    try:
        handle = await asyncio.to_thread(ray.get_actor, spec.router_name, namespace=spec.namespace)
    except ValueError:
        handle = None
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
    opts: dict[str, Any] = {"num_cpus": 0, "name": spec.router_name, "namespace": spec.namespace}
    if spec.detached_router:
        opts["lifetime"] = "detached"
    handle = await _spawn(RouterActor, opts, timeout_s=spec.start_timeout_s)
    await await_ref(handle.ping.remote(), timeout_s=spec.start_timeout_s, what="router.ping")
    return handle, False
