"""The Ray runtime: the runner, the replica fleet and its supervisor, actors and proxies.

Engine- and trainer-agnostic: what runs in a replica comes from an engine plug-in
(`dynsched_ray.engines`), what trains from a trainer plug-in (`dynsched_ray.trainers`).
The modules: `runner` (`RayRunner`, `run_ray`), `workload` (`RunWorkload`, the hooks a
job plugs into the one runner; `StandInWorkload`, the default of ``dynsched run``), `fleet` (`RayFleet`), `supervisor`
(restarts), `proxies` (core-facing handles of the actors), `actors`, `remote` (awaiting
Ray calls with deadlines), `placement` (GPU pools), `security` (starting Ray safely),
`errors`. The names below are imported on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynsched_ray._lazy import lazy_getattr

if TYPE_CHECKING:
    from dynsched_ray.runtime.fleet import FleetSpec, RayFleet, ReplicaFactory
    from dynsched_ray.runtime.placement import ResourcePools
    from dynsched_ray.runtime.runner import (
        RayRunner,
        RayRunOptions,
        RayRunResult,
        load_checkpoint,
        run_ray,
    )
    from dynsched_ray.runtime.supervisor import ReplicaSupervisor, RestartOptions
    from dynsched_ray.runtime.workload import RunWorkload, StandInWorkload

__all__ = [
    "FleetSpec",
    "RayFleet",
    "RayRunOptions",
    "RayRunResult",
    "RayRunner",
    "ReplicaFactory",
    "ReplicaSupervisor",
    "ResourcePools",
    "RestartOptions",
    "RunWorkload",
    "StandInWorkload",
    "load_checkpoint",
    "run_ray",
]

_MODULE = {
    "FleetSpec": "fleet",
    "RayFleet": "fleet",
    "ReplicaFactory": "fleet",
    "ResourcePools": "placement",
    "RayRunOptions": "runner",
    "RayRunResult": "runner",
    "RayRunner": "runner",
    "load_checkpoint": "runner",
    "run_ray": "runner",
    "ReplicaSupervisor": "supervisor",
    "RestartOptions": "supervisor",
    "RunWorkload": "workload",
    "StandInWorkload": "workload",
}
__getattr__ = lazy_getattr(__name__, {k: f"{__name__}.{m}" for k, m in _MODULE.items()})
