"""Schedulers for the cluster simulator.

Baselines: FIFO, DRF (progressive filling), Tetris, SRTF, Tiresias (2D-LAS); the
Optimus family (``optimus``, ``optimus-oracle``, ``optimus+``) is hosted here but lives
in :mod:`dynsched_optimus.scheduler` (composed strategies fed by observation records);
:class:`OptimusScheduler` only translates. See docs/cluster.md.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from dynsched_optimus import STRATEGIES, JobPlacement, PlacementRequest, even_split, place
from dynsched_optimus.scheduler import (
    AdaptiveBatch,
    CompletionRule,
    JobObservation,
    OptimusPolicy,
    Round,
    ScheduleDecision,
    make_optimus,
)

from ._jobs import SimJob
from ._pollux import PolluxScheduler
from ._sim import ClusterState
from ._spec import Placement

__all__ = [
    "SCHEDULERS",
    "DRFScheduler",
    "FIFOScheduler",
    "FixedDRFScheduler",
    "OptimusScheduler",
    "SRTFScheduler",
    "TetrisScheduler",
    "TiresiasScheduler",
    "empty_placement",
    "make_scheduler",
    "observe",
    "place_jobs",
]


def _min_tasks(job: SimJob) -> tuple[int, int]:
    return (1, 1) if job.max_ps > 0 else (1, 0)


def _req(job: SimJob) -> tuple[int, int]:
    return (min(job.requested_workers, job.max_workers), job.requested_ps if job.max_ps else 0)


def _demand(job: SimJob, w: int, p: int) -> np.ndarray:
    return w * job.worker_demand + p * job.ps_demand


def _requested_remaining(job: SimJob, num_nodes: int) -> float:
    """True seconds left with the requested tasks all on the first server (the oracle
    remaining time SRTF orders by and Tetris weighs)."""
    w, p = _req(job)
    return job.true_remaining_time(Placement.of(num_nodes, {0: w}, {0: p}))


def place_jobs(
    requests: dict[str, tuple[int, int]],
    jobs: Sequence[SimJob],
    capacity: np.ndarray,
    *,
    strategy: str = "fewest",
    order: Sequence[str] | None = None,
    shrink: bool = False,
    fill: bool = True,
) -> dict[str, Placement]:
    """Place ``(workers, ps)`` per job with :func:`dynsched_optimus.place`.

    A job whose counts did not change keeps its current placement (``previous``) when
    it still fits; zero counts are skipped.  ``order`` (job names) is the order new
    placements are made in (default: ascending demand); ``strategy``, ``shrink`` and
    ``fill`` are :func:`~dynsched_optimus.place`'s.

    Returns:
        The placements of the jobs that could be placed (with ``shrink``, possibly with
        fewer tasks than requested).
    """
    by_name = {j.name: j for j in jobs}
    reqs = []
    previous: dict[str, JobPlacement] = {}
    for name, (w, p) in requests.items():
        if w + p <= 0:
            continue
        job = by_name[name]
        reqs.append(PlacementRequest(name, p, w, tuple(job.ps_demand), tuple(job.worker_demand)))
        if job.placement is not None:
            previous[name] = _to_job_placement(name, job.placement)
    ids = {r.job_id for r in reqs}
    listed = None if order is None else list(dict.fromkeys(n for n in order if n in ids))
    res = place(
        reqs,
        np.maximum(capacity, 0.0),
        previous=previous,
        strategy=strategy,
        order=listed,
        shrink=shrink,
        fill=fill,
    )
    return _as_placements(res.placements, by_name, capacity.shape[0])


def _as_placements(
    placed: Mapping[str, JobPlacement], by_name: Mapping[str, SimJob], n_nodes: int
) -> dict[str, Placement]:
    """The simulator's placements; a job placed where it already runs keeps its object."""
    out: dict[str, Placement] = {}
    for name, jp in placed.items():
        cur = by_name[name].placement
        pl = _to_placement(jp, n_nodes)
        out[name] = cur if cur is not None and cur.same_tasks(pl) else pl
    return out


class _Base:
    name = "base"
    placement_mode = "fewest"

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        raise NotImplementedError


class _OrderedGang(_Base):
    """Jobs admitted with their requested gang in the order of :meth:`key` (see `_gang`)."""

    #: Stop at the first job that does not fit (no backfill) instead of skipping it.
    strict = False

    def key(self, job: SimJob, num_nodes: int) -> tuple[float | str, ...]:
        """The sort key of ``job`` on a cluster of ``num_nodes`` servers."""
        raise NotImplementedError

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        n = len(cluster.capacity)
        order = sorted(jobs, key=lambda j: self.key(j, n))
        return _gang(order, cluster, strict=self.strict)


class FIFOScheduler(_OrderedGang):
    """First come, first served; gang of the requested tasks; no preemption, no backfill."""

    name = "fifo"
    strict = True

    def key(self, job: SimJob, num_nodes: int) -> tuple[float | str, ...]:
        return (job.submit_time, job.name)


class DRFScheduler(_Base):
    """Dominant Resource Fairness by progressive filling, capped at the requested tasks.

    Repeatedly the job with the lowest dominant share (ties by submission, name) gets one
    more task (a worker, or a PS when its PS/worker ratio is below the requested one;
    its first unit is one worker plus one PS for PS jobs) while the cluster's aggregate
    capacity allows; tasks are then spread over the least-loaded servers.
    """

    name = "drf"

    def __init__(self, placement: str = "spread") -> None:
        if placement not in STRATEGIES:
            raise ValueError(f"placement={placement!r}: allowed values are {list(STRATEGIES)}")
        self.placement_mode = placement

    def allocate(self, jobs: Sequence[SimJob], capacity: np.ndarray) -> dict[str, tuple[int, int]]:
        """Progressive filling; returns task counts per job."""
        total = capacity.sum(axis=0)
        tot_safe = np.where(total > 0, total, np.inf)
        free = total.astype(float).copy()
        counts = {j.name: [0, 0] for j in jobs}
        share = {j.name: 0.0 for j in jobs}
        heap = [(0.0, j.submit_time, j.name, i) for i, j in enumerate(jobs)]
        heapq.heapify(heap)
        while heap:
            _, _, name, i = heapq.heappop(heap)
            job = jobs[i]
            w, p = counts[name]
            rw, rp = _req(job)
            if w == 0:
                step = _min_tasks(job)
            elif rp and p * rw < w * rp and p < rp:
                step = (0, 1)
            elif w < rw:
                step = (1, 0)
            elif p < rp:
                step = (0, 1)
            else:
                continue
            need = _demand(job, *step)
            if not np.all(need <= free + 1e-9):
                continue  # this job can take nothing more; others may
            free -= need
            counts[name] = [w + step[0], p + step[1]]
            share[name] = float(np.max(_demand(job, *counts[name]) / tot_safe))
            heapq.heappush(heap, (share[name], job.submit_time, name, i))
        return {k: (v[0], v[1]) for k, v in counts.items() if v[0] > 0}

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        counts = self.allocate(jobs, cluster.capacity)
        # fragmentation: a job whose tasks do not all fit keeps those that do (shrink)
        return place_jobs(counts, jobs, cluster.capacity, strategy=self.placement_mode, shrink=True)


class FixedDRFScheduler(DRFScheduler):
    """DRF with each job's allocation fixed when it starts (the Optimus paper's baseline).

    Running jobs keep their tasks until they complete (no re-filling); in each interval
    the waiting jobs share the capacity left free by progressive filling on dominant
    shares (capped at their request, ties by submission) and, once placed, keep that
    allocation. Elastic :class:`DRFScheduler` re-fills every interval instead.
    """

    name = "drf-fixed"

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        running = [j for j in jobs if j.placement is not None]
        waiting = [j for j in jobs if j.placement is None]
        if not waiting:
            return {j.name: j.placement for j in running if j.placement is not None}
        used = np.zeros_like(cluster.capacity, dtype=float)
        for job in running:
            assert job.placement is not None
            used += job.placement.usage(job.worker_demand, job.ps_demand)
        counts = self.allocate(waiting, cluster.capacity - used)
        # running jobs keep their tasks (reserved first as unchanged placements)
        for job in running:
            assert job.placement is not None
            counts[job.name] = (job.placement.num_workers, job.placement.num_ps)
        return place_jobs(counts, jobs, cluster.capacity, strategy=self.placement_mode, shrink=True)


class TetrisScheduler(_Base):
    """Tetris: packing alignment plus shortest remaining time (true durations).

    Running jobs keep their tasks; waiting jobs are taken by the score
    ``alignment(demand, free) / max alignment + srtf_weight * min_remaining / remaining``
    and each of their tasks goes to the server with the best alignment.
    """

    name = "tetris"

    def __init__(self, srtf_weight: float = 1.0) -> None:
        self.srtf_weight = srtf_weight

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        cap = cluster.capacity
        tot = np.where(cap.sum(axis=0) > 0, cap.sum(axis=0), np.inf)
        out: dict[str, Placement] = {}
        free = cap.astype(float).copy()
        for job in jobs:
            if job.placement is not None:
                out[job.name] = job.placement
                free -= job.placement.usage(job.worker_demand, job.ps_demand)
        waiting = [j for j in jobs if j.placement is None]
        rem = {j.name: _requested_remaining(j, len(cap)) for j in waiting}
        while waiting:
            fsum = free.sum(axis=0) / tot
            scores = []
            for j in waiting:
                w, p = _req(j)
                align = float((_demand(j, w, p) / tot) @ fsum)
                scores.append(align)
            amax = max(scores) or 1.0
            rmin = min(rem[j.name] for j in waiting)
            best = max(
                range(len(waiting)),
                key=lambda i: (
                    scores[i] / amax + self.srtf_weight * rmin / max(rem[waiting[i].name], 1e-9),
                    -waiting[i].submit_time,
                ),
            )
            job = waiting.pop(best)
            w, p = _req(job)
            # Tetris' packing on what is still free: each task to the best-aligned server
            res = place(
                [PlacementRequest(job.name, p, w, tuple(job.ps_demand), tuple(job.worker_demand))],
                np.maximum(free, 0.0),
                strategy="align",
            )
            jp = res.placements.get(job.name)
            if jp is None:
                continue
            pl = _to_placement(jp, len(cap))
            out[job.name] = pl
            free -= pl.usage(job.worker_demand, job.ps_demand)
        return out


class SRTFScheduler(_OrderedGang):
    """Preemptive shortest remaining time first (true remaining time), requested gangs."""

    name = "srtf"

    def key(self, job: SimJob, num_nodes: int) -> tuple[float | str, ...]:
        return (_requested_remaining(job, num_nodes), job.submit_time, job.name)


def _admit(
    order: Sequence[SimJob], cluster: ClusterState, *, strict: bool = False
) -> dict[str, tuple[int, int]]:
    """The requested ``(workers, ps)`` of the jobs in ``order`` while their total fits.

    A job that does not fit is skipped; with ``strict`` (FIFO), the first one that does
    not fit and is not running ends the admission.
    """
    free = cluster.capacity.sum(axis=0).astype(float)
    requests: dict[str, tuple[int, int]] = {}
    for job in order:
        w, p = _req(job)
        need = _demand(job, w, p)
        if np.all(need <= free + 1e-9):
            requests[job.name] = (w, p)
            free -= need
        elif strict and job.placement is None:
            break
    return requests


def _gang(
    order: Sequence[SimJob], cluster: ClusterState, *, strict: bool = False
) -> dict[str, Placement]:
    """Admit jobs in ``order`` with their requested tasks while they fit (skip others).

    With ``strict`` (FIFO) the first job that does not fit, or that is admitted but could
    not be placed, ends the admission.
    """
    requests = _admit(order, cluster, strict=strict)
    placed = place_jobs(requests, order, cluster.capacity, order=[j.name for j in order])
    if not strict:
        return placed
    out = {}
    for job in order:
        if job.name in placed:
            out[job.name] = placed[job.name]
        elif job.name in requests:
            break
    return out


class TiresiasScheduler(_Base):
    """Tiresias' discretised 2D-LAS.

    Attained service (worker-seconds held, i.e. GPU-seconds for GPU jobs) moves a job to
    a lower-priority queue when it crosses each threshold (default: one threshold of 16
    GPU-hours, the Pollux artifact's setting). Queues in priority order, FIFO by
    submission inside a queue; jobs are admitted with their requested gang while the
    cluster fits them, the rest are preempted. A job never moves back up unless
    ``starvation_factor`` is set: then a queued job that waited more than that factor
    times its executed time returns to the first queue.
    """

    name = "tiresias"

    def __init__(
        self, thresholds: Sequence[float] = (16 * 3600.0,), starvation_factor: float | None = None
    ) -> None:
        if list(thresholds) != sorted(thresholds) or any(t <= 0 for t in thresholds):
            raise ValueError(f"thresholds={thresholds!r}: must be positive and increasing")
        self.thresholds = tuple(float(t) for t in thresholds)
        self.starvation_factor = starvation_factor
        self.queue: dict[str, int] = {}
        self._base_service: dict[str, float] = {}
        self._waited: dict[str, float] = {}
        self._last = 0.0

    def queue_of(self, job: SimJob) -> int:
        """Current queue index of ``job`` (0 = highest priority)."""
        service = job.attained_service - self._base_service.get(job.name, 0.0)
        q = int(np.searchsorted(self.thresholds, service, side="right"))
        self.queue[job.name] = max(q, 0)
        return self.queue[job.name]

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        dt = now - self._last
        self._last = now
        if self.starvation_factor is not None:
            for j in jobs:
                if j.placement is None and j.attained_service > 0:
                    self._waited[j.name] = self._waited.get(j.name, 0.0) + dt
                    executed = (j.attained_service - self._base_service.get(j.name, 0.0)) / max(
                        j.requested_workers, 1
                    )
                    if self._waited[j.name] >= self.starvation_factor * executed > 0:
                        self._base_service[j.name] = j.attained_service
                        self._waited[j.name] = 0.0
        order = sorted(jobs, key=lambda j: (self.queue_of(j), j.submit_time, j.name))
        return _gang(order, cluster)


class _SimTruth:
    """The simulator's ground truth, handed to ``optimus-oracle`` as its :class:`Truth`."""

    def __init__(self) -> None:
        self.jobs: dict[str, SimJob] = {}
        self.capacity = np.zeros((1, 4))
        self._empty: dict[tuple[object, ...], Placement | None] = {}

    def remaining_steps(self, job_id: str) -> float:
        return float(self.jobs[job_id].true_remaining_steps())

    def speed(self, job_id: str, ps: int, workers: int, nodes: int) -> float:
        job = self.jobs[job_id]
        if job.max_ps == 0:  # all-reduce: GPUs per node of an even spread over ``nodes``
            per = _per_node(job, self.capacity)
            k = max(nodes, -(-workers // per))
            if k == -(-workers // per):
                full, rem = divmod(workers, per)
                shape = tuple([per] * full + ([rem] if rem else []))
            else:
                shape = tuple(x for x in even_split(workers, k) if x)
            rate: float = 1.0 / job.true_iter_time(shape)  # type: ignore[attr-defined]
            return rate
        pl = empty_placement(job, workers, ps, self.capacity, self._empty)
        return job.true_speed(pl) if pl is not None else 1e-9


def _per_node(job: SimJob, capacity: np.ndarray) -> int:
    d = job.worker_demand
    pos = d > 0
    return max(int(np.floor(capacity[:, pos] / d[pos] + 1e-9).min(axis=1).max()), 1)


def empty_placement(
    job: SimJob,
    workers: int,
    ps: int,
    capacity: np.ndarray,
    cache: dict[tuple[object, ...], Placement | None] | None = None,
) -> Placement | None:
    """Where ``place`` puts ``workers`` + ``ps`` tasks of ``job`` on an empty cluster."""
    key = (workers, ps, tuple(job.worker_demand), tuple(job.ps_demand), capacity.tobytes())
    if cache is not None and key in cache:
        return cache[key]
    res = place(
        [PlacementRequest(job.name, ps, workers, tuple(job.ps_demand), tuple(job.worker_demand))],
        capacity,
        fill=True,
    )
    jp = res.placements.get(job.name)
    out = _to_placement(jp, capacity.shape[0]) if jp is not None else None
    if cache is not None:
        cache[key] = out
    return out


def _to_placement(jp: JobPlacement, n_nodes: int) -> Placement:
    ws = [0] * n_nodes
    ps = [0] * n_nodes
    for nd, pp, ww in zip(jp.nodes, jp.ps_per_node, jp.workers_per_node, strict=True):
        ws[nd] += ww
        ps[nd] += pp
    return Placement(ws, ps)


def _to_job_placement(name: str, pl: Placement) -> JobPlacement:
    nodes = tuple(i for i, (w, p) in enumerate(zip(pl.workers, pl.ps, strict=True)) if w or p)
    return JobPlacement(
        name, nodes, tuple(pl.ps[i] for i in nodes), tuple(pl.workers[i] for i in nodes)
    )


def observe(job: SimJob) -> JobObservation:
    """The observation record of a simulated job (what the scheduler may know of it)."""
    allreduce = job.max_ps == 0
    completion: CompletionRule
    if allreduce:
        mode = getattr(job, "completion", "target")
        if mode == "epochs":
            n_ep = job.profile.completion_epochs(job.batch_size, "epochs")  # type: ignore[attr-defined]
            completion = CompletionRule("epochs", n_ep)
        else:
            completion = CompletionRule("target_metric", float(job.target_loss or 0.0))
    else:
        completion = CompletionRule("converged", float(getattr(job, "delta_conv", 0.002)))
    adaptive = None
    if job.adaptive:
        (lo, hi), (lmin, lmax) = job.batch_limits(), job.local_limits()  # type: ignore[attr-defined]
        stats = job.grad_stats
        adaptive = AdaptiveBatch(
            init_batch=lo,
            max_batch=hi,
            min_local=lmin,
            max_local=lmax,
            grad_sqr=None if stats is None else stats[0],
            grad_var=None if stats is None else stats[1],
            progress=job.progress,  # type: ignore[attr-defined]
            progress_per_epoch=job.progress_per_epoch,  # type: ignore[attr-defined]
            progress_points=tuple(job.progress_points),  # type: ignore[attr-defined]
        )
    return JobObservation(
        job_id=job.name,
        kind="allreduce" if allreduce else "ps",
        worker_demand=tuple(job.worker_demand),
        ps_demand=tuple(job.ps_demand),
        arrival=job.submit_time,
        requested_workers=job.requested_workers,
        requested_ps=job.requested_ps,
        max_workers=max(job.max_workers, 1),
        max_ps=None if allreduce else max(job.max_ps, 1),
        iterations_done=job.steps_done,
        epochs_done=job.epochs_done,
        throughput={k: tuple(v) for k, v in job.speed_samples.items()},
        loss_points=tuple(job.loss_points),
        completion=completion,
        restarts=job.num_restarts,
        placement=None if job.placement is None else _to_job_placement(job.name, job.placement),
        batch_size=float(job.batch_size),
        adaptive_batch=adaptive,
    )


class OptimusScheduler(_Base):
    """The simulator's host for the composed Optimus policies of ``dynsched_optimus``.

    Builds a :class:`~dynsched_optimus.scheduler.JobObservation` per runnable job
    (:func:`observe`), calls :class:`~dynsched_optimus.scheduler.OptimusPolicy` and turns
    its placements into :class:`Placement`; satisfies the policy's pre-run requests
    (each configuration placed by ``place`` on an empty cluster) and, for
    ``optimus-oracle``, answers its truth queries. It reads nothing else.

    Args:
        oracle: ``optimus-oracle``.
        plus: ``optimus+``.
        allocation_only: ablation: spread placement instead of Theorem 1.
        hedge_quantile: ``optimus+``: end of the remaining-steps interval used.
        shortest_weight: ``optimus+``: utility exponent ``a`` (1: ``log T``).
        remaining_work: ``optimus+rw`` (allocation by marginal gain in predicted JCT,
            :class:`~dynsched_optimus.scheduler.RemainingWorkAllocation`; its options
            ``remaining_estimate``, ``jct_exponent``, ``max_slowdown``, ``min_gain``).
        **kwargs: passed to :func:`~dynsched_optimus.scheduler.make_optimus`
            (``damping``, ``prior_s``, ``prerun_s``, ``prerun_limit``, ``hysteresis``,
            ``min_gain``, ``extrapolation``, ``compact``).
    """

    def __init__(
        self,
        *,
        oracle: bool = False,
        plus: bool = False,
        allocation_only: bool = False,
        hedge_quantile: str = "low",
        shortest_weight: float = 1.0,
        remaining_work: bool = False,
        **kwargs: Any,
    ) -> None:
        variant = "optimus+" if plus else ("optimus-oracle" if oracle else "optimus")
        if remaining_work:
            variant = "optimus+rw"
        self.name = variant
        if plus and kwargs.get("batch") == "fixed":
            self.name = "optimus+fixed-batch"
        self.truth = _SimTruth()
        self.policy: OptimusPolicy = make_optimus(
            variant,
            truth=self.truth if oracle else None,
            spread=allocation_only,
            hedge=hedge_quantile,
            utility_exponent=shortest_weight,
            **kwargs,
        )
        self.prerun_s = float(kwargs.get("prerun_s", 10.0))
        self._capacity = np.zeros((1, 4))
        self._empty: dict[tuple[object, ...], Placement | None] = {}
        self.last_decision: ScheduleDecision | None = None
        #: CPU seconds of each :meth:`schedule` call (the policy's decision time)
        self.decision_seconds: list[float] = []

    def prerun_configs(self, job: SimJob, capacity: np.ndarray) -> list[Placement]:
        """The policy's pre-run request, each configuration placed on an empty cluster."""
        req = self.policy.prerun_request(observe(job))
        self.prerun_s = req.seconds_each
        out = []
        for p, w in req.configs:
            pl = empty_placement(job, w, p, capacity, self._empty)
            if pl is not None:
                out.append(pl)
        return out

    def _round(self, now: float, jobs: Sequence[SimJob], cap: np.ndarray) -> Round:
        self.truth.jobs = {j.name: j for j in jobs}
        self.truth.capacity = cap
        return self.policy.new_round(now, [observe(j) for j in jobs], cap)

    def remaining_steps(self, job: SimJob) -> tuple[float, float, float, bool]:
        """``(estimate, low, high, fitted)`` remaining steps of ``job``."""
        r = self._round(0.0, [job], self._capacity).remaining[job.name]
        return r.estimate, r.low, r.high, r.fitted

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        cap = cluster.capacity
        self._capacity = cap
        self.truth.jobs = {j.name: j for j in jobs}
        self.truth.capacity = cap
        t0 = time.process_time()
        dec = self.policy.schedule(
            now, [observe(j) for j in jobs], cap, restart_delay_s=cluster.restart_delay_s
        )
        self.decision_seconds.append(time.process_time() - t0)
        self.last_decision = dec
        by_name = {j.name: j for j in jobs}
        out = _as_placements(dec.placements, by_name, cap.shape[0])
        for name, batch in dec.batch_sizes.items():
            if name in out:
                out[name] = attrs.evolve(out[name], batch_size=int(batch))
        return out

    def prediction_report(self, now: float, jobs: Sequence[SimJob]) -> tuple[float, float] | None:
        """Median relative speed and remaining-steps errors over running jobs."""
        if self.name == "optimus-oracle":
            return None
        running = [j for j in jobs if j.placement is not None and j.loss_points]
        if not running:
            return None
        rnd = self._round(now, running, self._capacity)
        units = getattr(self.policy.estimator, "adaptive", None)
        se, re = [], []
        for job in running:
            pl = job.placement
            assert pl is not None
            obs = rnd.jobs[job.name]
            est = self.policy.estimator.speed(obs, pl.num_ps, pl.num_workers, pl.nodes_used, rnd)
            goodput = units is not None and units(obs) is not None
            # a job estimated in goodput: progress per second and progress left
            true = job.true_goodput(pl) if goodput else job.true_speed(pl)  # type: ignore[attr-defined]
            se.append(abs(est - true) / true)
            r_true = job.remaining_progress() if goodput else job.true_remaining_steps()  # type: ignore[attr-defined]
            if r_true > 0:
                re.append(abs(rnd.remaining[job.name].estimate - r_true) / r_true)
        return float(np.median(se)), float(np.median(re)) if re else float("nan")


#: Registered scheduler names and their factories.
SCHEDULERS: dict[str, Callable[..., _Base | PolluxScheduler]] = {
    "fifo": FIFOScheduler,
    "drf": DRFScheduler,
    "drf-fixed": FixedDRFScheduler,
    "tetris": TetrisScheduler,
    # the paper's Tetris baseline: each job's allocation is fixed when it starts, which
    # is what ``tetris`` does (running jobs keep their tasks); named beside ``drf-fixed``
    "tetris-fixed": TetrisScheduler,
    "srtf": SRTFScheduler,
    "tiresias": TiresiasScheduler,
    "optimus": lambda **kw: OptimusScheduler(**kw),
    "optimus-oracle": lambda **kw: OptimusScheduler(oracle=True, **kw),
    "optimus+": lambda **kw: OptimusScheduler(plus=True, **kw),
    # optimus+ allocating by marginal gain in predicted JCT (remaining work / goodput)
    "optimus+rw": lambda **kw: OptimusScheduler(remaining_work=True, **kw),
    # ablation: optimus+ with every job keeping its submitted batch size
    "optimus+fixed-batch": lambda **kw: OptimusScheduler(plus=True, batch="fixed", **kw),
    # Pollux (OSDI'21): goodput speedups, fairness power mean, genetic search (_pollux.py)
    "pollux": PolluxScheduler,
}


def make_scheduler(name: str, **kwargs: object) -> _Base | PolluxScheduler:
    """Build a scheduler by name (one of :data:`SCHEDULERS`)."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r}: allowed values are {sorted(SCHEDULERS)}")
    return SCHEDULERS[name](**kwargs)
