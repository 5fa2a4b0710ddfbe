"""What a rollout returns: per-attempt results, version-stamped token segments, outcomes.

`GenerateRequest` and `GenerateResult` are also importable from ``dynsched_core``.
"""

from __future__ import annotations

from dynsched_core._client import RolloutOutcome
from dynsched_core._protocols import FinishReason, GenerateRequest, GenerateResult, TokenSegment

__all__ = [
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "RolloutOutcome",
    "TokenSegment",
]
