"""What a rollout returns: per-attempt results, version-stamped token segments, outcomes.

`GenerateRequest` and `GenerateResult` are also importable from ``dynsched_core``.
`ReplicaIdentity` is the id/capabilities/role part every replica class shares (a base to
inherit); `ReplicaLifecycle` (phases `ReplicaPhase`) is the one lifecycle state machine
(accepting, paused, asleep, closed) the in-memory, vLLM and HF replicas keep their state in.
`ReplicaPlacement` (pool, bundle, GPU ids, node) and `ReplicaSpec` (factory and options)
are the record a runtime gives `ReplicaSet.add` for each replica it launches.
"""

from __future__ import annotations

from dynsched_core._client import RolloutOutcome
from dynsched_core._lifecycle import ReplicaLifecycle, ReplicaPhase
from dynsched_core._protocols import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    ReplicaIdentity,
    TokenSegment,
)
from dynsched_core._replicas import ReplicaMember, ReplicaPlacement, ReplicaSpec

__all__ = [
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "ReplicaIdentity",
    "ReplicaLifecycle",
    "ReplicaMember",
    "ReplicaPhase",
    "ReplicaPlacement",
    "ReplicaSpec",
    "RolloutOutcome",
    "TokenSegment",
]
