"""Optimus on Ray: real training jobs scheduled by the Optimus family (issue 30).

:class:`JobStore` (SQLite) holds the jobs and what they reported, :class:`OptimusService`
runs them as groups of Ray actors (:class:`WorkerGroup`, torch.distributed gloo on CPU)
under the scheduler the simulator uses, and ``dynsched optimus serve|submit|status|cancel``
(:mod:`dynsched_ray.optimus.cli`) drives it. Jobs follow :mod:`dynsched_optimus.jobs`.
Names are imported on first access: ``submit``/``status``/``cancel`` never load Ray.
"""

from __future__ import annotations

from dynsched_ray._lazy import lazy_getattr

_EXECUTOR = "dynsched_ray.optimus.executor"
_SERVICE = "dynsched_ray.optimus.service"
_STORE = "dynsched_ray.optimus.store"

#: name -> module it is imported from on first access
_LAZY = {
    "JobWorker": _EXECUTOR,
    "WorkerGroup": _EXECUTOR,
    "cluster_nodes": _EXECUTOR,
    "node_labels": _EXECUTOR,
    "OptimusService": _SERVICE,
    "ServiceOptions": _SERVICE,
    "status_lines": _STORE,
    "ACTIVE_STATES": _STORE,
    "BATCH_HOW": _STORE,
    "STATES": _STORE,
    "JobRow": _STORE,
    "JobStore": _STORE,
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
