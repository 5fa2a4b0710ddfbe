"""What a rollout returns: per-attempt results, version-stamped token segments, outcomes.

`GenerateRequest` and `GenerateResult` are also importable from ``dynsched_core``.
`ReplicaIdentity` is the id/capabilities/role part every replica class shares (a base to
inherit).
"""

from __future__ import annotations

from dynsched_core._client import RolloutOutcome
from dynsched_core._protocols import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    ReplicaIdentity,
    TokenSegment,
)

__all__ = [
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "ReplicaIdentity",
    "RolloutOutcome",
    "TokenSegment",
]
