"""From what real jobs measured to the scheduler's decision: one code path with the simulator.

A host of real jobs keeps a :class:`JobRecord` per job (what its workers reported);
:func:`observe_record` turns it into the same :class:`~dynsched_optimus.scheduler.JobObservation`
the simulator builds from its jobs, and :func:`make_decider` returns the policy the
simulator would run under that name: the Optimus family is
:meth:`~dynsched_optimus.scheduler.OptimusPolicy.schedule` itself; ``fifo`` and ``drf``
are the simulator's baselines restated on observation records (same order, same caps,
same :func:`~dynsched_optimus.place` calls).

A job whose file has ``adaptive_batch`` gets the simulator's goodput record as well
(:class:`~dynsched_optimus.scheduler.AdaptiveBatch`: its range, its gradient statistics
and its progress, :func:`progress_by_step`), so ``optimus+`` chooses its batch as it does
for a simulated job; the :class:`Decision` carries the chosen batches.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._goodput import AdaptiveBatch, efficiency_gain
from dynsched_optimus._observation import JobObservation
from dynsched_optimus._placement import JobPlacement, PlacementRequest, place
from dynsched_optimus._scheduler import make_optimus, optimus_variants
from dynsched_optimus.jobs._spec import JobSpec

__all__ = [
    "DECIDERS",
    "GRAD_WINDOW",
    "LOSS_POINTS",
    "MIN_SPEED_REPORTS",
    "Decider",
    "Decision",
    "JobRecord",
    "bucket_loss_points",
    "make_decider",
    "observe_record",
    "progress_by_step",
]

#: ``(workers, ps, nodes, batch) -> iterations/s samples``
Throughput = Mapping[tuple[float, ...], tuple[float, ...]]
#: steps whose gradient statistics are averaged into a job's current ones (judgement: one
#: step's estimate from a few micro-batches is noisy; 20 steps follow a tiny job's
#: training closely; Pollux smooths its estimates too, with its own constants)
GRAD_WINDOW = 20

#: loss points handed to the scheduler per job: the reports averaged in this many buckets
#: at most (judgement: enough for the convergence fit, cheap to refit every round)
LOSS_POINTS = 50
#: steady step reports (not a run's first) that make one throughput sample (judgement:
#: fewer is mostly noise on a shared CPU)
MIN_SPEED_REPORTS = 5


def bucket_loss_points(
    points: Sequence[tuple[float, float]], limit: int = LOSS_POINTS
) -> tuple[tuple[float, float], ...]:
    """At most about ``limit`` ``(mean step, mean loss)`` points, in step order.

    The reports of a job, sorted by step, are averaged in consecutive buckets of
    ``len(points) // limit`` (at least 1): what a host of real jobs and the simulator's
    measured jobs hand the scheduler.
    """
    if not points:
        return ()
    ordered = sorted(points)
    size = max(len(ordered) // limit, 1)
    out = []
    for i in range(0, len(ordered), size):
        chunk = ordered[i : i + size]
        out.append((sum(s for s, _ in chunk) / len(chunk), sum(v for _, v in chunk) / len(chunk)))
    return tuple(out)


@attrs.frozen
class JobRecord:
    """What a host measured of one real job.

    Attributes:
        spec: the submitted job.
        arrival: submission time (the host's clock, seconds).
        iterations_done: steps completed (from the last report).
        loss_points: ``(step, loss)`` points.
        throughput: measured steps/s per configuration run.
        restarts: re-allocations and recoveries so far.
        placement: where the job runs now (None: waiting).
        batch_size: the global batch the job trains with now (0: the spec's).
        grad_stats: ``(grad_sqr, grad_var)`` as the job reports them (squared norm of the
            gradient; variance of one example's gradient), smoothed (None: none reported).
        progress: progress so far in initial-batch iterations weighted by efficiency
            (:func:`progress_by_step`; a job with ``adaptive_batch`` only).
        progress_points: ``(progress, loss)`` points, as ``loss_points``.
    """

    spec: JobSpec
    arrival: float
    iterations_done: float = 0.0
    loss_points: tuple[tuple[float, float], ...] = ()
    throughput: Throughput = attrs.field(factory=dict)
    restarts: int = 0
    placement: JobPlacement | None = None
    batch_size: int = 0
    grad_stats: tuple[float, float] | None = None
    progress: float = 0.0
    progress_points: tuple[tuple[float, float], ...] = ()


def progress_by_step(
    reports: Iterable[tuple[int, float, float | None, float | None]], init_batch: float
) -> tuple[dict[int, float], tuple[float, float] | None]:
    """A goodput job's progress after each step, and its current gradient statistics.

    Args:
        reports: ``(step, global batch, grad_sqr, grad_var)`` in the order reported (a
            step reported again after a restart replaces the earlier report); ``grad_var``
            is the variance of one example's gradient (the report's convention).
        init_batch: the job's ``adaptive_batch.init_batch``.

    Returns:
        ``step -> progress`` (cumulative: one step at batch ``M`` adds
        :func:`~dynsched_optimus.scheduler.efficiency_gain` with the statistics known then,
        ``grad_var / init_batch`` being the variance at the initial batch; ``M /
        init_batch`` before any are known, as :class:`AdaptiveBatch` takes it) and the
        mean statistics of the last :data:`GRAD_WINDOW` steps that reported them.
    """
    last: dict[int, tuple[float, float | None, float | None]] = {}
    for step, batch, sqr, var in reports:
        last[int(step)] = (float(batch), sqr, var)
    window: collections.deque[tuple[float, float]] = collections.deque(maxlen=GRAD_WINDOW)
    total, out = 0.0, {}
    stats: tuple[float, float] | None = None
    for step in sorted(last):
        batch, sqr, var = last[step]
        if sqr is not None and var is not None:
            window.append((float(sqr), float(var)))
            stats = (
                sum(w[0] for w in window) / len(window),
                sum(w[1] for w in window) / len(window),
            )
        sqr_, var_ = (0.0, 0.0) if stats is None else (stats[0], stats[1] / init_batch)
        total += float(efficiency_gain(batch, init_batch, sqr_, var_))
        out[step] = total
    return out, stats


def _adaptive(record: JobRecord) -> AdaptiveBatch | None:
    """The spec's batch range with the record's statistics and progress."""
    ab = record.spec.adaptive_batch
    if ab is None:
        return None
    stats = record.grad_stats
    return attrs.evolve(
        ab,
        grad_sqr=None if stats is None else stats[0],
        grad_var=None if stats is None else stats[1] / ab.init_batch,
        progress=record.progress,
        progress_points=record.progress_points,
    )


def observe_record(record: JobRecord) -> JobObservation:
    """The observation record of a real job (an all-reduce job: workers, no PS); a job with
    ``adaptive_batch`` carries its :class:`AdaptiveBatch` (range, statistics, progress)."""
    spec = record.spec
    return JobObservation(
        job_id=spec.name,
        kind="allreduce",
        worker_demand=spec.resources,
        arrival=record.arrival,
        requested_workers=spec.workers,
        max_workers=spec.max_workers,
        iterations_done=record.iterations_done,
        throughput={k: v for k, v in record.throughput.items()},
        loss_points=record.loss_points,
        completion=spec.completion,
        restarts=record.restarts,
        placement=record.placement,
        batch_size=float(record.batch_size or spec.batch_size),
        adaptive_batch=_adaptive(record),
    )


@attrs.frozen
class Decision:
    """One round's answer: where each job runs, its predicted remaining work, its batch.

    Attributes:
        placements: ``job_id -> JobPlacement`` (absent: the job waits).
        remaining: ``job_id -> remaining steps`` where the policy estimates them (progress
            units for a job estimated on goodput).
        batch_sizes: ``job_id -> global batch`` for the jobs whose batch changes (the
            policy's ``ScheduleDecision.batch_sizes``; the others keep theirs).
    """

    placements: Mapping[str, JobPlacement]
    remaining: Mapping[str, float] = attrs.field(factory=dict)
    batch_sizes: Mapping[str, int] = attrs.field(factory=dict)


#: ``decide(now, observations, node_capacity, restart_delay_s) -> Decision``
Decider = Callable[[float, Sequence[JobObservation], npt.ArrayLike, float], Decision]


def _optimus(name: str) -> Decider:
    policy = make_optimus(name)

    def decide(
        now: float, obs: Sequence[JobObservation], cap: npt.ArrayLike, restart_delay_s: float
    ) -> Decision:
        dec = policy.schedule(now, obs, cap, restart_delay_s=restart_delay_s)
        remaining = {k: r.estimate for k, r in dec.remaining.items()}
        return Decision(dec.placements, remaining, dict(dec.batch_sizes))

    return decide


def _requests(obs: Sequence[JobObservation], counts: Mapping[str, int]) -> list[PlacementRequest]:
    return [
        PlacementRequest(o.job_id, 0, counts[o.job_id], o.ps_demand, o.worker_demand)
        for o in obs
        if counts.get(o.job_id, 0) > 0
    ]


def _previous(obs: Sequence[JobObservation]) -> dict[str, JobPlacement]:
    return {o.job_id: o.placement for o in obs if o.placement is not None}


def _requested(o: JobObservation) -> int:
    return min(o.requested_workers, o.max_workers or o.requested_workers)


def _fifo(
    now: float, obs: Sequence[JobObservation], cap: npt.ArrayLike, restart_delay_s: float
) -> Decision:
    """First come first served, the requested workers as a gang, stop at the first that
    does not fit (the simulator's ``fifo``)."""
    order = sorted(obs, key=lambda o: (o.arrival, o.job_id))
    c = np.maximum(np.asarray(cap, dtype=np.float64), 0.0)
    free = c.sum(axis=0)
    counts: dict[str, int] = {}
    for o in order:
        need = _requested(o) * np.asarray(o.worker_demand)
        if not np.all(need <= free + 1e-9):
            break
        free -= need
        counts[o.job_id] = _requested(o)
    res = place(
        _requests(order, counts),
        c,
        previous=_previous(obs),
        order=[o.job_id for o in order if o.job_id in counts],
        fill=True,
    )
    out: dict[str, JobPlacement] = {}
    for o in order:
        if o.job_id not in res.placements:
            break
        out[o.job_id] = res.placements[o.job_id]
    return Decision(out)


def _drf(
    now: float, obs: Sequence[JobObservation], cap: npt.ArrayLike, restart_delay_s: float
) -> Decision:
    """Progressive filling on dominant shares up to the requested workers, spread over
    the least-loaded servers (the simulator's ``drf`` for all-reduce jobs)."""
    c = np.maximum(np.asarray(cap, dtype=np.float64), 0.0)
    total = c.sum(axis=0)
    safe = np.where(total > 0, total, np.inf)
    free = total.copy()
    counts = {o.job_id: 0 for o in obs}
    heap = [(0.0, o.arrival, o.job_id, i) for i, o in enumerate(obs)]
    heapq.heapify(heap)
    while heap:
        _, _, jid, i = heapq.heappop(heap)
        d = np.asarray(obs[i].worker_demand)
        if counts[jid] >= _requested(obs[i]) or not np.all(d <= free + 1e-9):
            continue
        free -= d
        counts[jid] += 1
        heapq.heappush(heap, (float(np.max(counts[jid] * d / safe)), obs[i].arrival, jid, i))
    res = place(_requests(obs, counts), c, previous=_previous(obs), strategy="spread", shrink=True)
    return Decision(dict(res.placements))


#: scheduler names a host of real jobs accepts, and how each is built
def _optimus_factory(name: str) -> Callable[[], Decider]:
    return lambda: _optimus(name)


DECIDERS: dict[str, Callable[[], Decider]] = {
    **{name: _optimus_factory(name) for name in optimus_variants() if name != "optimus-oracle"},
    "fifo": lambda: _fifo,
    "drf": lambda: _drf,
}


def make_decider(name: str) -> Decider:
    """The decision function of scheduler ``name`` (one of :data:`DECIDERS`).

    Raises:
        OptimusError: an unknown name (the allowed ones listed).
    """
    if name not in DECIDERS:
        raise OptimusError(f"scheduler={name!r}: allowed values are {sorted(DECIDERS)}")
    return DECIDERS[name]()
