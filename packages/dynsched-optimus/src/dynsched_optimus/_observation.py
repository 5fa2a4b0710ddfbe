"""The observation record a host feeds to the Optimus scheduler, one per job and round.

The scheduler (:mod:`dynsched_optimus.scheduler`) reads nothing else about a job: a
simulator, a Ray autoscaler or a real cluster manager builds these records from what it
measured.  All fields are plain data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from dynsched_optimus._allocation import JOB_KINDS
from dynsched_optimus._errors import OptimusError
from dynsched_optimus._goodput import AdaptiveBatch
from dynsched_optimus._placement import JobPlacement

__all__ = [
    "COMPLETION_KINDS",
    "AdaptiveBatch",
    "CompletionRule",
    "JobObservation",
    "PrerunRequest",
    "ThroughputKey",
]

#: ``(workers, ps, nodes, global batch)``: one configuration a job ran with
ThroughputKey = tuple[int, int, int, float]

#: how a job ends: a target value of its loss/metric, N epochs, N steps, or convergence
#: (the fitted loss improves by less than ``value`` per epoch, the Optimus paper's rule)
COMPLETION_KINDS: tuple[str, ...] = ("target_metric", "epochs", "steps", "converged")


def _vec(value: object) -> tuple[float, ...]:
    return tuple(float(x) for x in value)  # type: ignore[attr-defined]


@attrs.frozen
class CompletionRule:
    """When a job is done.

    Attributes:
        kind: one of :data:`COMPLETION_KINDS`.
        value: ``target_metric``: the target *loss* (lower is better; a host with a
            higher-is-better metric such as accuracy passes e.g. ``1 - accuracy``);
            ``epochs``: the number of epochs; ``steps``: the number of iterations;
            ``converged``: the per-epoch improvement threshold ``delta`` of the
            normalised loss.
    """

    kind: str
    value: float = attrs.field(converter=float)

    def __attrs_post_init__(self) -> None:
        if self.kind not in COMPLETION_KINDS:
            raise OptimusError(
                f"field 'completion.kind' must be one of {list(COMPLETION_KINDS)}, "
                f"got {self.kind!r}"
            )
        if not (math.isfinite(self.value) and self.value >= 0):
            raise OptimusError(
                f"field 'completion.value' must be finite and >= 0, got {self.value}"
            )
        if self.kind in ("epochs", "steps", "converged") and self.value <= 0:
            raise OptimusError(f"field 'completion.value' must be > 0 for {self.kind!r}")


def _throughput(value: Mapping[Any, Any]) -> dict[tuple[float, ...], tuple[float, ...]]:
    out: dict[tuple[float, ...], tuple[float, ...]] = {}
    for key, samples in value.items():
        try:
            w, p, n, *rest = key
            ok = len(rest) <= 1 and w >= 1 and p >= 0 and n >= 1 and (not rest or rest[0] >= 0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise OptimusError(
                "field 'throughput': keys are (workers >= 1, ps >= 0, nodes >= 1) or "
                f"(workers, ps, nodes, batch >= 0), got {key!r}"
            )
        vals: tuple[float, ...] = tuple(samples)
        if not vals or not (min(vals) > 0 and math.isfinite(sum(vals))):
            raise OptimusError(f"field 'throughput[{key!r}]': samples must be finite and > 0")
        nk: tuple[float, ...] = (int(w), int(p), int(n))
        if rest:
            nk = (*nk, float(rest[0]))
        out[nk] = out.get(nk, ()) + vals
    return out


def _points(value: object) -> tuple[tuple[float, float], ...]:
    return tuple((float(s), float(v)) for s, v in value)  # type: ignore[attr-defined]


@attrs.frozen
class JobObservation:
    """What the scheduler knows about one job.

    Attributes:
        job_id: unique identifier.
        kind: ``"ps"`` (parameter servers + workers) or ``"allreduce"`` (GPU replicas).
        worker_demand: resources of one worker / replica (the host's resource order).
        ps_demand: resources of one PS (empty or zero for an all-reduce job).
        arrival: submission time (seconds, the host's clock).
        requested_workers: workers (GPUs) the user asked for (a prior for the speed).
        requested_ps: PS the user asked for.
        max_workers: most workers the job can use (``None``: no limit).
        max_ps: most PS (``None``: no limit; ignored for all-reduce jobs).
        iterations_done: training iterations completed so far.
        epochs_done: epochs completed so far.
        throughput: measured iterations/s per configuration run, keyed by
            ``(workers, ps, nodes)`` (measured at ``batch_size``) or ``(workers, ps,
            nodes, batch)`` (pre-runs included); several samples per key allowed.
            :attr:`throughput_by_batch` is the same with every key naming its batch.
        loss_points: ``(iteration, loss)`` points, one per epoch or evaluation.
        completion: when the job ends (``None``: ``converged`` with ``delta = 0.002``).
        restarts: how many times the job was restarted so far.
        placement: where the job runs now (``None``: waiting).
        batch_size: global batch size the job trains with now (the speed forms of
            all-reduce jobs use it).
        adaptive_batch: set when the scheduler may choose the job's batch size: its
            allowed range, gradient statistics and progress in batch-independent units
            (:class:`AdaptiveBatch`); ``None``: the batch is fixed.
    """

    job_id: str = attrs.field(converter=str)
    kind: str
    worker_demand: tuple[float, ...] = attrs.field(converter=_vec)
    ps_demand: tuple[float, ...] = attrs.field(default=(), converter=_vec)
    arrival: float = attrs.field(default=0.0, converter=float)
    requested_workers: int = 1
    requested_ps: int = 0
    max_workers: int | None = None
    max_ps: int | None = None
    iterations_done: float = attrs.field(default=0.0, converter=float)
    epochs_done: int = 0
    throughput: Mapping[tuple[float, ...], tuple[float, ...]] = attrs.field(
        factory=dict, converter=_throughput
    )
    loss_points: tuple[tuple[float, float], ...] = attrs.field(default=(), converter=_points)
    completion: CompletionRule | None = None
    restarts: int = 0
    placement: JobPlacement | None = None
    batch_size: float = attrs.field(default=0.0, converter=float)
    adaptive_batch: AdaptiveBatch | None = None
    #: ``throughput`` with every key ``(workers, ps, nodes, batch)`` (a key without a batch
    #: was measured at ``batch_size``); derived, not an argument
    throughput_by_batch: Mapping[ThroughputKey, tuple[float, ...]] = attrs.field(
        init=False, factory=dict
    )

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.batch_size) and self.batch_size >= 0):
            raise OptimusError(f"job {self.job_id!r}: field 'batch_size' must be finite and >= 0")
        if self.adaptive_batch is not None and not isinstance(self.adaptive_batch, AdaptiveBatch):
            raise OptimusError(
                f"job {self.job_id!r}: field 'adaptive_batch' must be an AdaptiveBatch or None"
            )
        merged: dict[ThroughputKey, tuple[float, ...]] = {}
        for k, v in self.throughput.items():
            nk = (int(k[0]), int(k[1]), int(k[2]), float(k[3]) if len(k) > 3 else self.batch_size)
            merged[nk] = merged.get(nk, ()) + v
        object.__setattr__(self, "throughput_by_batch", merged)
        if self.kind not in JOB_KINDS:
            raise OptimusError(
                f"job {self.job_id!r}: field 'kind' must be one of {list(JOB_KINDS)}, "
                f"got {self.kind!r}"
            )
        if not self.ps_demand:
            object.__setattr__(self, "ps_demand", (0.0,) * len(self.worker_demand))
        if len(self.ps_demand) != len(self.worker_demand):
            raise OptimusError(f"job {self.job_id!r}: ps_demand and worker_demand differ in length")
        for name in ("requested_workers", "epochs_done", "restarts", "requested_ps"):
            if getattr(self, name) < 0:
                raise OptimusError(f"job {self.job_id!r}: field {name!r} must be >= 0")
        for name in ("max_workers", "max_ps"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise OptimusError(f"job {self.job_id!r}: field {name!r} must be None or >= 1")
        if self.iterations_done < 0:
            raise OptimusError(f"job {self.job_id!r}: field 'iterations_done' must be >= 0")

    @property
    def steps_per_epoch(self) -> float | None:
        """Measured iterations per epoch (``None`` before the first epoch ends)."""
        if self.epochs_done <= 0:
            return None
        return self.iterations_done / self.epochs_done

    def measured(
        self, workers: int, ps: int, nodes: int, batch: float | None = None
    ) -> float | None:
        """Mean measured iterations/s of a configuration (at ``batch``, default the
        job's current batch), if it was run."""
        b = self.batch_size if batch is None else float(batch)
        s = self.throughput_by_batch.get((workers, ps, nodes, b))
        return sum(s) / len(s) if s else None


@attrs.frozen
class PrerunRequest:
    """Configurations the scheduler would like measured before a job starts.

    The host may run each (on a sample of the data, on an empty part of the cluster) and
    report the throughput in the job's next observation; it may also ignore the request.

    Attributes:
        configs: ``(ps, workers)`` pairs.
        seconds_each: how long each configuration should run.
    """

    configs: tuple[tuple[int, int], ...] = ()
    seconds_each: float = 0.0
