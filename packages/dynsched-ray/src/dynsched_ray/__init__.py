"""dynsched-ray: Ray actors and adapters that run the dynsched core across a Ray cluster."""

from __future__ import annotations

from dynsched_ray._actors import (
    QueueActor,
    ReplicaActor,
    RouterActor,
    TrainerWorkerActor,
    placement_info,
    remote_class,
)
from dynsched_ray._errors import (
    ActorUnavailableError,
    AllReplicasLostError,
    RemoteCallTimeoutError,
    ReplicaActorDiedError,
)
from dynsched_ray._fleet import FleetSpec, RayFleet, ReplicaFactory, default_replica_factory
from dynsched_ray._placement import ResourcePools
from dynsched_ray._proxies import RayQueue, RayReplica, RayRouter
from dynsched_ray._remote import await_ref
from dynsched_ray._runner import (
    RayRunner,
    RayRunOptions,
    RayRunResult,
    load_checkpoint,
    run_ray,
    synthetic_prompts,
)
from dynsched_ray._tiny_model import TinyModelSpec, build_tiny_model
from dynsched_ray._trainer import RayTrainerBackend

__version__ = "0.1.0"

__all__ = [
    "ActorUnavailableError",
    "AllReplicasLostError",
    "FleetSpec",
    "QueueActor",
    "RayFleet",
    "RayQueue",
    "RayReplica",
    "RayRouter",
    "RayRunOptions",
    "RayRunResult",
    "RayRunner",
    "RayTrainerBackend",
    "RemoteCallTimeoutError",
    "ReplicaActor",
    "ReplicaActorDiedError",
    "ReplicaFactory",
    "ResourcePools",
    "RouterActor",
    "TinyModelSpec",
    "TrainerWorkerActor",
    "await_ref",
    "build_tiny_model",
    "default_replica_factory",
    "load_checkpoint",
    "placement_info",
    "remote_class",
    "run_ray",
    "synthetic_prompts",
]
