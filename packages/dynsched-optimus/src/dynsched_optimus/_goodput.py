"""Goodput of a job whose batch size the scheduler may choose (Pollux's model, OSDI'21).

A job that lets the scheduler pick its global batch reports, besides its throughput,

* its *progress* in initial-batch iterations weighted by statistical efficiency: one
  iteration at global batch ``M`` adds ``gain(M) = (var + sqr) / (var / s + sqr)``
  (``s = M / init_batch``; ``sqr`` and ``var`` are the gradient's squared norm and
  variance, the gradient noise scale being ``init_batch * var / sqr``), so that the work
  left does not depend on the batch it will be done with;
* its gradient statistics and the batch range it allows (initial and largest global
  batch, smallest and largest per-GPU micro-batch; a larger local batch is reached by
  gradient accumulation).

The scheduler's speed of such a job is its **goodput**, progress per second,
``max_M gain(M) / t(workers, nodes, M)`` over the allowed batches, where ``t`` is the
iteration time the scheduler predicts (:mod:`dynsched_optimus._online_speed`); the batch
that attains the maximum is the one the job should train with on that placement.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import numpy as np

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._types import FloatArray

__all__ = [
    "BATCH_CANDIDATES",
    "AdaptiveBatch",
    "best_goodput",
    "efficiency_gain",
    "micro_steps",
]


#: global batch sizes tried per GPU count, spaced geometrically between the smallest and
#: the largest allowed (Pollux samples 50; 32 keep the step between candidates under
#: 12 % for a 32x batch range, well inside the model's error)
BATCH_CANDIDATES = 32


def efficiency_gain(
    batch: float | FloatArray, init_batch: float, grad_sqr: float, grad_var: float
) -> FloatArray:
    """Progress (initial-batch iterations) made by one iteration at ``batch``.

    ``gain = (var + sqr) / (var / s + sqr)`` with ``s = batch / init_batch``: 1 at the
    initial batch, at most ``s`` (perfectly efficient), close to 1 when the gradient noise
    is small.  Without a usable measurement (``sqr + var <= 0``) the batch is taken as
    perfectly efficient.
    """
    s = np.asarray(batch, dtype=np.float64) / float(init_batch)
    if not grad_sqr + grad_var > 0:
        return s
    return (grad_var + grad_sqr) / (grad_var / s + grad_sqr)


def micro_steps(batch: float | FloatArray, workers: int, max_local: float | None) -> FloatArray:
    """Micro-batches per iteration (1 + gradient-accumulation steps) on ``workers`` GPUs."""
    local = np.ceil(np.asarray(batch, dtype=np.float64) / workers - 1e-8)
    if max_local is None:
        return np.ones_like(local)
    return np.maximum(np.ceil(local / max_local - 1e-8), 1.0)


def _points(value: object) -> tuple[tuple[float, float], ...]:
    return tuple((float(s), float(v)) for s, v in value)  # type: ignore[attr-defined]


def _positive(_inst: object, attr: attrs.Attribute, value: float | None) -> None:  # type: ignore[type-arg]
    if value is not None and not (math.isfinite(value) and value > 0):
        raise OptimusError(
            f"field 'adaptive_batch.{attr.name}' must be finite and > 0, got {value}"
        )


def _nonneg(_inst: object, attr: attrs.Attribute, value: float | None) -> None:  # type: ignore[type-arg]
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise OptimusError(
            f"field 'adaptive_batch.{attr.name}' must be finite and >= 0, got {value}"
        )


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


@attrs.frozen
class AdaptiveBatch:
    """What a job that lets the scheduler choose its batch size reports (Pollux's terms).

    Attributes:
        init_batch: the smallest global batch, the unit of progress and of the gradient
            statistics (one progress unit = one perfectly efficient iteration at it).
        max_batch: the largest global batch the job allows.
        min_local: smallest per-GPU batch (a GPU count needing less is not usable).
        max_local: largest per-GPU micro-batch that fits on a GPU (``None``: no limit);
            a larger local batch is trained by gradient accumulation.
        grad_sqr: latest measured squared norm of the gradient (``None``: not yet).
        grad_var: latest measured gradient variance at ``init_batch`` (with ``grad_sqr``).
        progress: progress so far, in initial-batch iterations weighted by efficiency.
        progress_per_epoch: progress of one epoch (dataset size / ``init_batch``);
            ``None``: estimated from ``progress`` and the epochs done.
        progress_points: ``(progress, loss)`` points, as ``loss_points`` but against
            progress (the convergence fit of an adaptive job uses these).
    """

    init_batch: float = attrs.field(converter=float, validator=_positive)
    max_batch: float = attrs.field(converter=float, validator=_positive)
    min_local: float = attrs.field(default=1.0, converter=float, validator=_positive)
    max_local: float | None = attrs.field(default=None, converter=_opt_float, validator=_positive)
    grad_sqr: float | None = attrs.field(default=None, converter=_opt_float, validator=_nonneg)
    grad_var: float | None = attrs.field(default=None, converter=_opt_float, validator=_nonneg)
    progress: float = attrs.field(default=0.0, converter=float, validator=_nonneg)
    progress_per_epoch: float | None = attrs.field(
        default=None, converter=_opt_float, validator=_positive
    )
    progress_points: tuple[tuple[float, float], ...] = attrs.field(default=(), converter=_points)

    def __attrs_post_init__(self) -> None:
        if self.max_batch < self.init_batch:
            raise OptimusError(
                f"field 'adaptive_batch.max_batch' ({self.max_batch}) must be >= init_batch "
                f"({self.init_batch})"
            )
        if self.max_local is not None and self.max_local < self.min_local:
            raise OptimusError(
                f"field 'adaptive_batch.max_local' ({self.max_local}) must be >= min_local "
                f"({self.min_local})"
            )
        if (self.grad_sqr is None) != (self.grad_var is None):
            raise OptimusError("fields 'adaptive_batch.grad_sqr' and 'grad_var' come together")

    @property
    def has_stats(self) -> bool:
        """Whether gradient statistics were measured."""
        return self.grad_sqr is not None and self.grad_var is not None

    @property
    def max_workers(self) -> int:
        """Most GPUs the job can use (at the largest batch, ``min_local`` per GPU)."""
        return max(int(self.max_batch // self.min_local + 1e-9), 1)

    def gain(self, batch: float | FloatArray) -> FloatArray:
        """:func:`efficiency_gain` with the latest statistics (perfect without them)."""
        return efficiency_gain(batch, self.init_batch, self.grad_sqr or 0.0, self.grad_var or 0.0)

    def candidates(self, workers: int, n: int = BATCH_CANDIDATES) -> FloatArray:
        """Global batches allowed on ``workers`` GPUs (empty when none is)."""
        lo = math.ceil(max(self.init_batch, self.min_local * workers) - 1e-9)
        hi = math.floor(self.max_batch + 1e-9)
        if lo > hi:
            return np.zeros(0)
        if lo == hi:
            return np.array([float(lo)])
        return np.unique(np.clip(np.round(np.geomspace(lo, hi, n)), lo, hi))


def best_goodput(
    ab: AdaptiveBatch,
    workers: int,
    iter_time: Callable[[FloatArray, FloatArray], FloatArray],
) -> tuple[float, float]:
    """Best goodput on ``workers`` GPUs and the batch that attains it.

    Args:
        ab: the job's batch range and statistics.
        workers: GPU count.
        iter_time: predicted seconds per iteration for arrays of global batches and
            their micro-step counts (the placement fixed).

    Returns:
        ``(progress per second, global batch)``; ``(0.0, 0.0)`` when no batch is allowed
        on ``workers`` GPUs.  Ties go to the smaller batch.
    """
    cand = ab.candidates(workers)
    if cand.size == 0:
        return 0.0, 0.0
    t = np.maximum(iter_time(cand, micro_steps(cand, workers, ab.max_local)), 1e-9)
    good = ab.gain(cand) / t
    i = int(np.argmax(good))
    return float(good[i]), float(cand[i])
