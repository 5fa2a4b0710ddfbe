"""Rollout engines, one folder each, every one a plug-in of ``dynsched.engines``.

Built in: ``vllm`` (`dynsched_ray.engines.vllm`) and ``hf`` (`dynsched_ray.engines.hf`,
transformers' ``generate``). Another package adds an engine by naming an `EnginePlugin`
in its entry points (see `dynsched_ray.plugins`); `load_engine` finds any of them by name
(an unknown one raises `EngineLookupError` with the known names and the closest match).
`ReplicaLifecycle` is the serving state machine (accepting, paused, asleep, closed) every
replica shares, core's `InMemoryReplica` included (defined in ``dynsched_core``).
"""

from __future__ import annotations

from dynsched_ray.engines.lifecycle import Phase, ReplicaLifecycle
from dynsched_ray.plugins import ENGINE_GROUP, ENGINES, EngineLookupError, EnginePlugin

__all__ = [
    "ENGINE_GROUP",
    "EngineLookupError",
    "EnginePlugin",
    "Phase",
    "ReplicaLifecycle",
    "engine_names",
    "load_engine",
]

engine_names = ENGINES.names
load_engine = ENGINES.load
