"""The sample counts derived from the schedule settings, each defined once.

Every place that needs one of these numbers (the config, the policy context, the
rollouter's options, the metrics) calls the function here, so they cannot drift apart.
One *sample* is one prompt group, as the trainer consumes it.

Example:
    >>> step_required_samples(required_samples=32, trigger_parameter_sync_step=4)
    128
    >>> max_required_samples(32, 4, staleness_threshold=0.1)
    140
    >>> concurrency_cap(routable_replicas=2, concurrent_samples_per_replica=16, max_required=140)
    32
"""

from __future__ import annotations

__all__ = ["concurrency_cap", "max_required_samples", "step_required_samples"]


def step_required_samples(required_samples: int, trigger_parameter_sync_step: int) -> int:
    """Samples the trainer consumes per weight-sync cycle: ``required_samples * T``."""
    return required_samples * trigger_parameter_sync_step


def max_required_samples(
    required_samples: int, trigger_parameter_sync_step: int, staleness_threshold: float
) -> int:
    """Admission budget per parameter version (and the queue capacity, as in verl).

    ``int(required_samples * T * (1 + staleness_threshold))``.
    """
    step = step_required_samples(required_samples, trigger_parameter_sync_step)
    return int(step * (1.0 + staleness_threshold))


def concurrency_cap(
    routable_replicas: int, concurrent_samples_per_replica: int, max_required: int
) -> int:
    """Samples the rollouter may have in flight.

    ``min(routable_replicas * concurrent_samples_per_replica, max_required)``; a negative
    replica count counts as 0.
    """
    return min(max(0, routable_replicas) * concurrent_samples_per_replica, max_required)
