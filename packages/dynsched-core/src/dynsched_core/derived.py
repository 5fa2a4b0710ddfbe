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
    >>> ratio_samples(0.29, 100)
    29
"""

from __future__ import annotations

import math

from dynsched_core._errors import ConfigError

__all__ = [
    "check_ratio_range",
    "concurrency_cap",
    "max_required_samples",
    "ratio_samples",
    "step_required_samples",
]

#: ``ratio * samples`` within this of an integer counts as that integer (``0.29 * 100``
#: is ``28.999999999999996`` in binary floating point and must count as 29).
_FLOOR_EPS = 1e-9


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


def ratio_samples(ratio: float, samples: int) -> int:
    """``floor(ratio * samples)`` (never negative), robust to binary floating point just
    below an integer: the one floor formula of a deactivate ratio in samples, used by the
    guard rails' range and by policies that express their wait as a ratio."""
    return max(0, math.floor(ratio * samples + _FLOOR_EPS))


def check_ratio_range(owner: str, low: float, high: float, *, prefix: str = "") -> None:
    """Check that a deactivate ratio range ``[low, high]`` is ordered (each bound's own
    ``[0, 1]`` range is its field validator's business): the one check shared by the
    config, the guard rails and the context.

    Args:
        owner: Class name used in the message.
        low: ``{prefix}min_deactivate_ratio``.
        high: ``{prefix}max_deactivate_ratio``.
        prefix: Field-name prefix (``"dynamic_schedule_"`` in the config).

    Raises:
        ConfigError: ``high < low``; the message names the field and the allowed range.
    """
    if high < low:
        raise ConfigError(
            f"{owner}.{prefix}max_deactivate_ratio must be in "
            f"[{prefix}min_deactivate_ratio ({low:g}), 1], got {high:g}",
            key=f"{prefix}max_deactivate_ratio",
        )
