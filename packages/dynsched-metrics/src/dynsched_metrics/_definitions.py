"""The metric definitions, as pure functions.

Every function here is side-effect free and reads only its arguments, so the same code
computes the metrics of a live run (through `MetricsAggregator`), of a simulated run
and of a recorded history. Formulas: see the package README.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from dynsched_core.derived import concurrency_cap
from dynsched_core.events import RolloutEvent

__all__ = [
    "CYCLE_METRIC_KEYS",
    "MQ_SIZE",
    "RESOURCE_UTILIZATION",
    "ROLLOUT_RESOURCE_UTILIZATION",
    "STEP_GENERATED_SAMPLES",
    "TRAIN_ALLOCATED_TIME_S",
    "TRAIN_COMPUTE_KEYS",
    "TRAIN_COMPUTE_TIME_S",
    "TRAIN_RESOURCE_UTILIZATION",
    "HistoryPoint",
    "cluster_resource_utilization",
    "correct_placeholder_capacity",
    "hybrid_rollout_fraction",
    "mq_size",
    "rollout_capacity",
    "rollout_resource_utilization",
    "rollout_resource_utilization_arrays",
    "rollout_resource_utilization_reference",
    "step_generated_samples",
    "train_compute_time",
    "train_resource_utilization",
]

TRAIN_RESOURCE_UTILIZATION = "dynamic_resource/train_resource_utilization"
TRAIN_COMPUTE_TIME_S = "dynamic_resource/train_compute_time_s"
TRAIN_ALLOCATED_TIME_S = "dynamic_resource/train_allocated_time_s"
ROLLOUT_RESOURCE_UTILIZATION = "dynamic_resource/rollout_resource_utilization"
RESOURCE_UTILIZATION = "dynamic_resource/resource_utilization"
MQ_SIZE = "dynamic_resource/mq_size"
STEP_GENERATED_SAMPLES = "fully_async/rollouter/step_generated_samples"

#: Every key `MetricsAggregator` emits exactly once per sync cycle, in this order.
CYCLE_METRIC_KEYS: tuple[str, ...] = (
    TRAIN_RESOURCE_UTILIZATION,
    TRAIN_COMPUTE_TIME_S,
    TRAIN_ALLOCATED_TIME_S,
    ROLLOUT_RESOURCE_UTILIZATION,
    RESOURCE_UTILIZATION,
    MQ_SIZE,
    STEP_GENERATED_SAMPLES,
)

#: verl ``timing_raw`` keys that count as training-GPU compute (``ref`` is the string
#: value of ``Role.RefPolicy``). Missing keys count 0.
TRAIN_COMPUTE_KEYS: tuple[str, ...] = (
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
)

#: One history point ``(t, active_tasks, capacity)``.
HistoryPoint = tuple[float, int, int]


# --------------------------------------------------------------------------- rollout


def rollout_capacity(
    servers: int, concurrent_samples_per_replica: int, max_required_samples: int
) -> int:
    """``cap = min(servers * concurrent_samples_per_replica, max_required_samples)``.

    The core's one definition (`dynsched_core.derived.concurrency_cap`), with the
    arguments checked.

    Raises:
        ValueError: an argument is negative (names the argument).
    """
    for name, value in (
        ("servers", servers),
        ("concurrent_samples_per_replica", concurrent_samples_per_replica),
        ("max_required_samples", max_required_samples),
    ):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    return concurrency_cap(servers, concurrent_samples_per_replica, max_required_samples)


def _as_points(history: Iterable[Any]) -> tuple[list[HistoryPoint], bool]:
    """Normalise `RolloutEvent`\\ s or ``(t, active, cap)`` tuples; report a seed first point."""
    points: list[HistoryPoint] = []
    seed_first = False
    for i, item in enumerate(history):
        if isinstance(item, RolloutEvent):
            if i == 0 and item.kind == "seed":
                seed_first = True
            points.append((float(item.time), int(item.active), int(item.capacity)))
        else:
            t, active, cap = item
            points.append((float(t), int(active), int(cap)))
    return points, seed_first


def correct_placeholder_capacity(
    points: Sequence[HistoryPoint], *, seed_placeholder: bool = True
) -> list[HistoryPoint]:
    """Replace the placeholder capacity of a seed point by the first known capacity.

    The rollouter records a seed point at start-up, before the concurrency capacity is
    known, with capacity 0. Once a later point carries the real capacity, the seed's
    interval is attributed that capacity (otherwise the start-up interval would silently
    drop out of the denominator).

    Args:
        points: ``(t, active, cap)`` history, first point possibly the seed.
        seed_placeholder: True when the first point is a seed whose capacity 0 is a
            placeholder (pass False for a window that starts at a staleness reset).

    Returns:
        A new list; unchanged when there is nothing to correct (no seed, a seed with a
        real capacity, or no later point yet).
    """
    out = list(points)
    if seed_placeholder and len(out) >= 2 and out[0][2] == 0:
        t0, a0, _ = out[0]
        out[0] = (t0, a0, out[1][2])
    return out


def _check_points(points: Sequence[HistoryPoint], now: float | None) -> None:
    prev = -math.inf
    for k, (t, active, cap) in enumerate(points):
        if not math.isfinite(t):
            raise ValueError(f"history[{k}].time must be finite, got {t!r}")
        if t < prev:
            raise ValueError(
                f"history times must be non-decreasing: history[{k}].time={t} < {prev}"
            )
        if active < 0 or cap < 0:
            raise ValueError(
                f"history[{k}] active and capacity must be >= 0, got active={active}, capacity={cap}"
            )
        prev = t
    if now is not None and points and now < points[-1][0]:
        raise ValueError(f"now={now} is before the last history point ({points[-1][0]})")


def rollout_resource_utilization_reference(
    history: Iterable[Any], now: float | None = None, *, seed_placeholder: bool | None = None
) -> float:
    """Pure-Python reference of `rollout_resource_utilization` (one loop, no numpy).

    Args:
        history: `RolloutEvent`\\ s or ``(t, active, capacity)`` tuples in time order.
        now: Closes the window: the last point's values hold until ``now``. None means
            the last point is already the window's end.
        seed_placeholder: Whether the first point is a seed with a placeholder capacity
            (see `correct_placeholder_capacity`). None: True exactly when the first item
            is a `RolloutEvent` of kind ``"seed"``.

    Returns:
        ``sum dt_k*min(cap_k, active_k) / sum dt_k*cap_k`` in [0, 1]; 0.0 when the total
        capacity-time is 0.
    """
    points, seed_first = _as_points(history)
    seed = seed_first if seed_placeholder is None else seed_placeholder
    points = correct_placeholder_capacity(points, seed_placeholder=seed)
    _check_points(points, now)
    if now is not None and points:
        points.append((float(now), points[-1][1], points[-1][2]))
    used = 0.0
    weight = 0.0
    for k in range(len(points) - 1):
        dt = points[k + 1][0] - points[k][0]
        active, cap = points[k][1], points[k][2]
        if cap <= 0 or dt <= 0:
            continue  # zero-capacity intervals carry no weight
        used += dt * min(cap, active)
        weight += dt * cap
    if weight <= 0.0:
        return 0.0
    return min(1.0, used / weight)


def rollout_resource_utilization_arrays(
    times: npt.ArrayLike,
    active: npt.ArrayLike,
    capacity: npt.ArrayLike,
    now: float | None = None,
    *,
    seed_placeholder: bool = False,
    validate: bool = True,
) -> float:
    """Vectorised rollout utilization over array columns of the history.

    Same definition and arguments as `rollout_resource_utilization_reference`, with the
    history given as three equal-length arrays (no Python loop over points).

    Raises:
        ValueError: mismatched lengths, decreasing times, negative counts, ``now``
            before the last point.
    """
    t = np.asarray(times, dtype=np.float64)
    a = np.asarray(active, dtype=np.float64)
    c = np.asarray(capacity, dtype=np.float64)
    if not (t.shape == a.shape == c.shape) or t.ndim != 1:
        raise ValueError(
            f"times, active and capacity must be 1-D of equal length, got shapes "
            f"{t.shape}, {a.shape}, {c.shape}"
        )
    n = t.shape[0]
    if n == 0:
        return 0.0
    if validate:
        if not np.all(np.isfinite(t)):
            raise ValueError("history times must be finite")
        if n > 1 and np.any(np.diff(t) < 0):
            k = int(np.argmax(np.diff(t) < 0)) + 1
            raise ValueError(
                f"history times must be non-decreasing: history[{k}].time={t[k]} < {t[k - 1]}"
            )
        if np.any(a < 0) or np.any(c < 0):
            raise ValueError("history active and capacity must be >= 0")
        if now is not None and now < t[-1]:
            raise ValueError(f"now={now} is before the last history point ({t[-1]})")
    if seed_placeholder and n >= 2 and c[0] == 0:
        c = c.copy()
        c[0] = c[1]
    end = t[-1] if now is None else float(now)
    dt = np.empty(n, dtype=np.float64)
    np.subtract(t[1:], t[:-1], out=dt[:-1])
    dt[-1] = end - t[-1]
    weight = float(np.dot(dt, c))
    if weight <= 0.0:
        return 0.0
    used = float(np.dot(dt, np.minimum(a, c)))
    return min(1.0, max(0.0, used / weight))


def rollout_resource_utilization(
    history: Iterable[Any], now: float | None = None, *, seed_placeholder: bool | None = None
) -> float:
    """``dynamic_resource/rollout_resource_utilization`` over one staleness window.

    ``U = sum_k (t_{k+1}-t_k) * min(cap_k, active_k) / sum_k (t_{k+1}-t_k) * cap_k``, each
    interval with its own capacity; intervals with ``cap_k = 0`` carry no weight; 0.0
    when the total weight is 0; the window is closed at ``now`` so trailing idle time
    counts; a seed point's placeholder capacity 0 is replaced by the first known one.
    Vectorised with numpy; `rollout_resource_utilization_reference` is the loop it is
    proven equal to.

    Args:
        history: `RolloutEvent`\\ s or ``(t, active, capacity)`` tuples in time order.
        now: End of the window (None: the last point is the end).
        seed_placeholder: See `rollout_resource_utilization_reference`.
    """
    items = history if isinstance(history, Sequence) else list(history)
    if len(items) == 0:
        return 0.0
    first = items[0]
    times: npt.NDArray[Any]
    active: npt.NDArray[Any]
    capacity: npt.NDArray[Any]
    if isinstance(first, RolloutEvent):
        seed_first = first.kind == "seed"
        times = np.fromiter((e.time for e in items), np.float64, len(items))
        active = np.fromiter((e.active for e in items), np.int64, len(items))
        capacity = np.fromiter((e.capacity for e in items), np.int64, len(items))
    else:
        seed_first = False
        cols = np.asarray(items, dtype=np.float64)  # (t, active, cap) rows, converted in C
        if cols.ndim != 2 or cols.shape[1] != 3:
            raise ValueError(f"history must be (t, active, capacity) rows, got shape {cols.shape}")
        times, active, capacity = cols[:, 0], cols[:, 1], cols[:, 2]
    seed = seed_first if seed_placeholder is None else seed_placeholder
    return rollout_resource_utilization_arrays(times, active, capacity, now, seed_placeholder=seed)


def step_generated_samples(history: Iterable[Any]) -> int:
    """``fully_async/rollouter/step_generated_samples``: completions in the window.

    Counts the `RolloutEvent`\\ s of kind ``"complete"`` in one staleness window (the
    window starts at a reset, so the count restarts at 0 there).
    """
    return sum(1 for e in history if isinstance(e, RolloutEvent) and e.kind == "complete")


# --------------------------------------------------------------------------- train


def train_compute_time(
    timings: Mapping[str, float], keys: Sequence[str] = TRAIN_COMPUTE_KEYS
) -> float:
    """``compute_i``: sum of the training-compute timings of one micro-step (missing = 0)."""
    return float(sum(float(timings.get(k, 0.0)) for k in keys))


def train_resource_utilization(compute_s: float, allocated_s: float) -> float:
    """``dynamic_resource/train_resource_utilization`` from the cycle's summed totals.

    ``U_train = sum compute_i / sum alloc_i`` (computed once from the sums, never as a
    mean of per-step ratios); 0.0 when nothing was allocated; clipped to [0, 1] (the raw
    totals are emitted next to it, so inconsistent timings stay visible).
    """
    if not (allocated_s > 0.0) or not math.isfinite(allocated_s):
        return 0.0
    return min(1.0, max(0.0, compute_s / allocated_s))


# --------------------------------------------------------------------------- cluster


def hybrid_rollout_fraction(wait_s: float, step_s: float) -> float:
    """``x = clip(wait / step, 0, 1)``; 0 when ``step <= 0`` (hybrid did no rollout)."""
    if not (step_s > 0.0) or not math.isfinite(step_s) or not math.isfinite(wait_s):
        return 0.0
    return min(1.0, max(0.0, wait_s / step_s))


def cluster_resource_utilization(
    train_utilization: float,
    rollout_utilization: float,
    x: float,
    hybrid_gpus: float,
    standalone_gpus: float,
) -> float:
    """``dynamic_resource/resource_utilization``, GPU-time weighted.

    ``U = ((1-x)*a*U_train + (x*a + b)*U_rollout) / (a + b)`` with ``a`` hybrid-capable
    trainer GPUs and ``b`` standalone rollout GPUs; 0.0 when ``a + b = 0``.

    Raises:
        ValueError: negative GPU counts or ``x`` outside [0, 1].
    """
    if hybrid_gpus < 0 or standalone_gpus < 0:
        raise ValueError(
            f"hybrid_gpus and standalone_gpus must be >= 0, got {hybrid_gpus}, {standalone_gpus}"
        )
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must lie in [0, 1], got {x!r}")
    total = hybrid_gpus + standalone_gpus
    if total <= 0:
        return 0.0
    a, b = float(hybrid_gpus), float(standalone_gpus)
    value = ((1.0 - x) * a * train_utilization + (x * a + b) * rollout_utilization) / total
    return min(1.0, max(0.0, value))


def mq_size(snapshots: Sequence[int]) -> int:
    """``dynamic_resource/mq_size`` of a cycle: the last post-step snapshot (0 if none)."""
    return int(snapshots[-1]) if snapshots else 0
