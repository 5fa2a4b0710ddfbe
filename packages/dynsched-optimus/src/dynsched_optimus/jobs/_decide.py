"""From what real jobs measured to the scheduler's decision: one code path with the simulator.

A host of real jobs keeps a :class:`JobRecord` per job (what its workers reported);
:func:`observe_record` turns it into the same :class:`~dynsched_optimus.scheduler.JobObservation`
the simulator builds from its jobs, and :func:`make_decider` returns the policy the
simulator would run under that name: the Optimus family is
:meth:`~dynsched_optimus.scheduler.OptimusPolicy.schedule` itself; ``fifo`` and ``drf``
are the simulator's baselines restated on observation records (same order, same caps,
same :func:`~dynsched_optimus.place` calls).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._observation import JobObservation
from dynsched_optimus._placement import JobPlacement, PlacementRequest, place
from dynsched_optimus._scheduler import make_optimus, optimus_variants
from dynsched_optimus.jobs._spec import JobSpec

__all__ = [
    "DECIDERS",
    "LOSS_POINTS",
    "MIN_SPEED_REPORTS",
    "Decider",
    "Decision",
    "JobRecord",
    "bucket_loss_points",
    "make_decider",
    "observe_record",
]

#: ``(workers, ps, nodes, batch) -> iterations/s samples``
Throughput = Mapping[tuple[float, ...], tuple[float, ...]]

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
    """

    spec: JobSpec
    arrival: float
    iterations_done: float = 0.0
    loss_points: tuple[tuple[float, float], ...] = ()
    throughput: Throughput = attrs.field(factory=dict)
    restarts: int = 0
    placement: JobPlacement | None = None


def observe_record(record: JobRecord) -> JobObservation:
    """The observation record of a real job (an all-reduce job: workers, no PS)."""
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
        batch_size=float(spec.batch_size),
    )


@attrs.frozen
class Decision:
    """One round's answer: where each job runs, and its predicted remaining steps.

    Attributes:
        placements: ``job_id -> JobPlacement`` (absent: the job waits).
        remaining: ``job_id -> remaining steps`` where the policy estimates them.
    """

    placements: Mapping[str, JobPlacement]
    remaining: Mapping[str, float] = attrs.field(factory=dict)


#: ``decide(now, observations, node_capacity, restart_delay_s) -> Decision``
Decider = Callable[[float, Sequence[JobObservation], npt.ArrayLike, float], Decision]


def _optimus(name: str) -> Decider:
    policy = make_optimus(name)

    def decide(
        now: float, obs: Sequence[JobObservation], cap: npt.ArrayLike, restart_delay_s: float
    ) -> Decision:
        dec = policy.schedule(now, obs, cap, restart_delay_s=restart_delay_s)
        return Decision(dec.placements, {k: r.estimate for k, r in dec.remaining.items()})

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
