"""The embeddable Optimus scheduler: observation records in, allocations and placements out.

See :mod:`dynsched_optimus._scheduler` for the strategies and their constants, and
:mod:`dynsched_optimus._observation` for the record a host fills in.
"""

from __future__ import annotations

from dynsched_optimus import _scheduler
from dynsched_optimus._goodput import (
    BATCH_CANDIDATES,
    AdaptiveBatch,
    best_goodput,
    efficiency_gain,
    micro_steps,
)
from dynsched_optimus._observation import (
    COMPLETION_KINDS,
    CompletionRule,
    JobObservation,
    PrerunRequest,
)
from dynsched_optimus._scheduler import *  # noqa: F403  (exactly `_scheduler.__all__`)

__all__ = [
    "BATCH_CANDIDATES",
    "COMPLETION_KINDS",
    "AdaptiveBatch",
    "CompletionRule",
    "JobObservation",
    "PrerunRequest",
    "best_goodput",
    "efficiency_gain",
    "micro_steps",
    *_scheduler.__all__,
]
