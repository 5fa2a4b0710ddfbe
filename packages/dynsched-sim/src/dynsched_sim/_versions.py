"""Per-sample staleness measured in a simulated run: policy versions behind at consumption.

The simulated replicas write, per request, the weight version its first token was decoded
with (`StalenessLedger.first_token`); the simulated trainer hands every micro-batch it
consumes to `StalenessLedger.consume` with its own parameter version. Recording reads
state the run keeps anyway and schedules nothing, so it never changes a trajectory.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["StalenessLedger"]


def _p95(sorted_xs: Sequence[int]) -> int:
    """Nearest-rank 95th percentile of a sorted, non-empty sequence."""
    return sorted_xs[max(0, math.ceil(0.95 * len(sorted_xs)) - 1)]


@attrs.define
class StalenessLedger:
    """Staleness of every sample the trainer consumed, in policy versions behind.

    A sample (one prompt group) is ``trainer version - generation version`` versions
    behind, where the trainer version is the trainer's parameter version when a training
    step consumes the sample (the number of weight syncs before that step) and the
    generation version is the version of the sample's **first token**: the oldest
    version any of its responses was decoded with (a partial rollout resumed across a
    weight sync spans several versions; its first token's version is the reported one).
    The version of its last token is kept too (``last_token_mean``), as is the version
    the rollouter admitted it under (``admitted_mean``, verl's staleness window).

    Attributes:
        first_token: ``request id -> version`` of the request's first decoded token
            (written by the replicas of the run).
        behind: Reported staleness of each consumed sample, in consumption order.
        behind_last: Staleness by the last token's version, same order.
        behind_admitted: Staleness by the admission version, same order.
    """

    first_token: dict[str, int] = attrs.Factory(dict)
    behind: list[int] = attrs.Factory(list)
    behind_last: list[int] = attrs.Factory(list)
    behind_admitted: list[int] = attrs.Factory(list)

    def consume(self, trainer_version: int, samples: Sequence[Any]) -> None:
        """Record the samples one training step consumes at ``trainer_version``."""
        for s in samples:
            seen = [
                self.first_token[o.request_id]
                for o in s.responses
                if o.request_id in self.first_token
            ]
            self.behind.append(trainer_version - min(seen, default=s.param_version))
            self.behind_last.append(trainer_version - s.max_param_version)
            self.behind_admitted.append(trainer_version - s.param_version)

    def summary(self) -> dict[str, float]:
        """``count``, ``mean``, ``p95`` (nearest rank), ``max`` of the reported staleness,
        and ``last_token_mean``, ``admitted_mean`` (all 0 when nothing was consumed)."""
        if not self.behind:
            keys = ("count", "mean", "p95", "max", "last_token_mean", "admitted_mean")
            return dict.fromkeys(keys, 0)
        xs = sorted(self.behind)
        return {
            "count": len(xs),
            "mean": statistics.fmean(xs),
            "p95": _p95(xs),
            "max": xs[-1],
            "last_token_mean": statistics.fmean(self.behind_last),
            "admitted_mean": statistics.fmean(self.behind_admitted),
        }
