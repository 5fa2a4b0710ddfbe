"""Schedulers for the cluster simulator.

Baselines: FIFO, DRF (progressive filling), Tetris, SRTF, Tiresias (2D-LAS); the
Optimus family: ``optimus`` (fitted models, pre-runs, no oracle), ``optimus-oracle``
(true remaining work and speed) and ``optimus+`` (ours: prediction-interval hedging,
incremental restart-aware gains with hysteresis on ``sum log T``, placement-aware GPU
counts and, optionally, statistical-efficiency aware batch sizes). See docs/cluster.md.
"""

from __future__ import annotations

import functools
import heapq
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dynsched_optimus import (
    AllocationJob,
    ConvergenceConfig,
    JobPlacement,
    OptimusError,
    PlacementRequest,
    PSSpeedModel,
    allocate,
    fit_speed,
    place,
    plan_sampling,
)
from dynsched_optimus import fit_convergence as opt_fit_convergence
from dynsched_optimus import remaining_steps_interval as opt_remaining_interval

from ._jobs import GpuJob, PSJob, SimJob
from ._models import fit_allreduce_speed, predict_allreduce_time
from ._placement import place_fewest, place_requests, place_spread
from ._sim import ClusterState
from ._spec import Placement

__all__ = [
    "SCHEDULERS",
    "DRFScheduler",
    "FIFOScheduler",
    "OptimusScheduler",
    "SRTFScheduler",
    "TetrisScheduler",
    "TiresiasScheduler",
    "make_scheduler",
]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def _planned(n: int, batch: float) -> tuple[tuple[int, int], ...]:
    return tuple(plan_sampling(n, max_ps=8, max_workers=8, global_batch=batch))


def _min_tasks(job: SimJob) -> tuple[int, int]:
    return (1, 1) if job.max_ps > 0 else (1, 0)


def _req(job: SimJob) -> tuple[int, int]:
    return (min(job.requested_workers, job.max_workers), job.requested_ps if job.max_ps else 0)


def _demand(job: SimJob, w: int, p: int) -> np.ndarray:
    return w * job.worker_demand + p * job.ps_demand


class _Base:
    name = "base"
    placement_mode = "fewest"

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        raise NotImplementedError


class FIFOScheduler(_Base):
    """First come, first served; gang of the requested tasks; no preemption, no backfill."""

    name = "fifo"

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        order = sorted(jobs, key=lambda j: (j.submit_time, j.name))
        requests: dict[str, tuple[int, int]] = {}
        free = cluster.capacity.sum(axis=0)
        for job in order:
            w, p = _req(job)
            need = _demand(job, w, p)
            if np.all(need <= free + 1e-9):
                requests[job.name] = (w, p)
                free = free - need
            elif job.placement is None:
                break
        placed = place_requests(requests, jobs, cluster.capacity, order=[j.name for j in order])
        # strict FIFO: stop at the first job that could not be placed
        out = {}
        for job in order:
            if job.name in placed:
                out[job.name] = placed[job.name]
            elif job.name in requests:
                break
        return out


class DRFScheduler(_Base):
    """Dominant Resource Fairness by progressive filling, capped at the requested tasks.

    Repeatedly the job with the lowest dominant share (ties by submission, name) gets one
    more task (a worker, or a PS when its PS/worker ratio is below the requested one;
    its first unit is one worker plus one PS for PS jobs) while the cluster's aggregate
    capacity allows; tasks are then spread over the least-loaded servers.
    """

    name = "drf"

    def __init__(self, placement: str = "spread") -> None:
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
        out = place_requests(counts, jobs, cluster.capacity, mode=self.placement_mode)
        return _shrink_unplaced(counts, out, jobs, cluster, self.placement_mode)


def _shrink_unplaced(
    counts: dict[str, tuple[int, int]],
    out: dict[str, Placement],
    jobs: Sequence[SimJob],
    cluster: ClusterState,
    mode: str,
) -> dict[str, Placement]:
    """Retry jobs that did not fit with fewer workers (fragmentation)."""
    missing = [n for n in counts if n not in out]
    if not missing:
        return out
    by_name = {j.name: j for j in jobs}
    used = sum(
        (pl.usage(by_name[n].worker_demand, by_name[n].ps_demand) for n, pl in out.items()),
        np.zeros_like(cluster.capacity),
    )
    free = cluster.capacity - used
    for name in missing:
        job = by_name[name]
        w, p = counts[name]
        while w > 1:
            w -= 1
            if mode == "spread":
                pl = place_spread(w, p, job.worker_demand, job.ps_demand, free, cluster.capacity)
            else:
                pl = place_fewest(
                    w,
                    p,
                    job.worker_demand,
                    job.ps_demand,
                    free,
                    cluster.capacity,
                    compact=mode == "compact",
                )
            if pl is not None:
                out[name] = pl
                free = free - pl.usage(job.worker_demand, job.ps_demand)
                break
    return out


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
        rem = {}
        for j in waiting:
            w, p = _req(j)
            pl = Placement([w] + [0] * (len(cap) - 1), [p] + [0] * (len(cap) - 1))
            rem[j.name] = j.true_remaining_time(pl)
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
            pl = self._pack(job, free)
            if pl is None:
                continue
            out[job.name] = pl
            free -= pl.usage(job.worker_demand, job.ps_demand)
        return out

    @staticmethod
    def _pack(job: SimJob, free: np.ndarray) -> Placement | None:
        free = free.copy()
        n = len(free)
        w, p = _req(job)
        ws = np.zeros(n, dtype=int)
        ps = np.zeros(n, dtype=int)
        norm = np.where(free.max(axis=0) > 0, free.max(axis=0), 1.0)
        for d, out, cnt in ((job.worker_demand, ws, w), (job.ps_demand, ps, p)):
            for _ in range(cnt):
                ok = np.all(free >= d[None, :] - 1e-9, axis=1)
                if not ok.any():
                    return None
                score = np.where(ok, (free / norm) @ (d / norm), -np.inf)
                i = int(np.argmax(score))
                out[i] += 1
                free[i] -= d
        return Placement(ws, ps)


class SRTFScheduler(_Base):
    """Preemptive shortest remaining time first (true remaining time), requested gangs."""

    name = "srtf"

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        n = len(cluster.capacity)

        def key(j: SimJob) -> tuple[float, float, str]:
            w, p = _req(j)
            pl = Placement([w] + [0] * (n - 1), [p] + [0] * (n - 1))
            return (j.true_remaining_time(pl), j.submit_time, j.name)

        order = sorted(jobs, key=key)
        return _gang(order, cluster)


def _gang(order: Sequence[SimJob], cluster: ClusterState) -> dict[str, Placement]:
    """Admit jobs in ``order`` with their requested tasks while they fit (skip others)."""
    free = cluster.capacity.sum(axis=0).astype(float)
    requests = {}
    for job in order:
        w, p = _req(job)
        need = _demand(job, w, p)
        if np.all(need <= free + 1e-9):
            requests[job.name] = (w, p)
            free -= need
    return place_requests(requests, order, cluster.capacity, order=[j.name for j in order])


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


class OptimusScheduler(_Base):
    """Optimus: marginal-gain greedy on fitted remaining time, fewest-server placement.

    Args:
        oracle: use true remaining steps and true speed (Optimus+Oracle).
        plus: our improvements (``optimus+``), see ``docs/cluster.md``.
        damping: gain factor for jobs whose models rest on few points (paper: 0.95).
        min_points: loss points needed before the convergence fit is used.
        prior_s: remaining seconds assumed at one worker before the fit exists.
        prerun_s: seconds per pre-run configuration (not for the oracle).
        prerun_limit: most configurations pre-run for GPU jobs (default 10; ``optimus+``:
            0 - it starts from the submitted GPU count as a prior and learns online); none
            when only one configuration is possible. PS jobs pre-run at least 5.
        allocation_only: ablation: spread placement instead of Optimus' placement.
        hedge_quantile: ``optimus+``: which end of the remaining-steps interval to use.
        shortest_weight: ``optimus+``: the allocation maximises ``-sum F(T_j)`` with
            ``F(T) = log T`` for ``a = 1`` (default) or ``T**(1 - a) / (1 - a)``.
        hysteresis: ``optimus+``: a running job changes its tasks only when the
            estimated saving exceeds ``hysteresis * restart_delay``.
        compact: ``optimus+``: when a GPU job's tasks would be fragmented over more
            servers than needed, take the GPU count (down to half) with the best estimated
            speed on the placement actually available.
        extrapolation: ``optimus+``: the speed of a GPU job beyond this factor of its
            largest measured GPU count is taken as flat (``None``: trust the fit).
        min_gain: ``optimus+``: a task is added only when it improves the job's utility by
            at least this much (``log T``: 1 % of its remaining time).
        adapt_batch: ``optimus+``: choose the global batch from the measured gradient
            statistics (statistical efficiency) for GPU jobs.
    """

    def __init__(
        self,
        *,
        oracle: bool = False,
        plus: bool = False,
        damping: float = 0.95,
        min_points: int = 3,
        prior_s: float = 3600.0,
        prerun_s: float = 10.0,
        allocation_only: bool = False,
        hedge_quantile: str = "low",
        shortest_weight: float = 1.0,
        hysteresis: float = 2.0,
        adapt_batch: bool = False,
        prerun_limit: int | None = None,
        compact: bool = True,
        extrapolation: float | None = 2.0,
        min_gain: float = 0.01,
        seed: int = 0,
    ) -> None:
        self.oracle = oracle
        self.plus = plus
        self.damping = damping
        self.min_points = min_points
        self.prior_s = prior_s
        self.prerun_s = prerun_s
        self.placement_mode = (
            "spread" if allocation_only else ("aware" if plus and compact else "fewest")
        )
        self.extrapolation = extrapolation
        self.min_gain = min_gain
        self.hedge_quantile = hedge_quantile
        self.shortest_weight = shortest_weight if plus else 0.0
        self.hysteresis = hysteresis
        self.adapt_batch = adapt_batch and plus
        self.prerun_limit = prerun_limit if prerun_limit is not None else (0 if plus else 10)
        self.rng = np.random.default_rng(seed)
        self.name = "optimus+" if plus else ("optimus-oracle" if oracle else "optimus")
        self._conv_cache: dict[str, tuple[int, tuple[float, float, float] | None]] = {}
        self._speed_cache: dict[str, tuple[int, Any]] = {}
        self._memo: dict[tuple[object, ...], float] = {}
        self._empty_pl: dict[tuple[object, ...], Placement | None] = {}
        self._tick = 0
        self._capacity = np.zeros((1, 4))

    # ---------------------------------------------------------------- pre-runs
    def prerun_configs(self, job: SimJob, capacity: np.ndarray) -> list[Placement]:
        """Configurations pre-run when a job arrives (none for the oracle).

        Each is placed as Optimus would place it on an empty cluster (fewest servers).
        """
        if self.oracle:
            return []
        if isinstance(job, GpuJob):
            sizes = [n for n in (1, 2, 4, 8) if n <= job.max_workers]
            if len(sizes) <= 1:
                return []  # a single possible configuration needs no pre-run
            combos = [(n, 0) for n in sizes][: self.prerun_limit]
        else:
            # dynsched-optimus' sampling planner (D-optimal, off the p = w diagonal)
            n = min(max(self.prerun_limit, 5), 9)  # the sync PS model needs 5 points
            combos = [(w, p) for p, w in _planned(n, float(job.batch_size))]
        out = []
        for w, p in combos:
            if isinstance(job, PSJob):
                pl = self._ps_empty_placement(job, w, p, capacity)
            else:
                pl = place_fewest(w, p, job.worker_demand, job.ps_demand, capacity, capacity)
            if pl is not None:
                out.append(pl)
        return out

    # ---------------------------------------------------------------- estimates
    def _shape(self, job: SimJob, n: int, per_node: int) -> tuple[int, ...]:
        full, rem = divmod(n, per_node)
        return tuple([per_node] * full + ([rem] if rem else []))

    def remaining_steps(self, job: SimJob) -> tuple[float, float, float, bool]:
        """``(estimate, low, high, fitted)`` remaining steps."""
        if self.oracle:
            r = job.true_remaining_steps()
            return r, r, r, True
        n_pts = len(job.loss_points)
        cached = self._conv_cache.get(job.name)
        if cached is None or cached[0] != n_pts:
            est = None
            if n_pts >= self.min_points:
                est = self._fit_remaining(job)
            self._conv_cache[job.name] = (n_pts, est)
            cached = self._conv_cache[job.name]
        est = cached[1]
        if est is None:
            speed1 = self._speed(job, 1, 1 if isinstance(job, PSJob) else 0, 4)
            prior = max(self.prior_s * speed1, job.steps_done)
            return prior, prior, prior, False
        return est[0], est[1], est[2], True

    def speed_on(self, job: SimJob, pl: Placement, per_node: int) -> float:
        """Estimated speed of ``job`` on the placement ``pl`` (its node count matters)."""
        if not isinstance(job, GpuJob):
            return self._speed(job, pl.num_workers, pl.num_ps, per_node)
        w, k = pl.num_workers, pl.nodes_used
        m = job.measured_speed((w, 0, k))
        if m is not None:
            return m
        k_min = -(-w // per_node)
        coef = self._speed_fit(job)
        if coef is not None and not self.oracle:
            return 1.0 / predict_allreduce_time(coef, w, k, job.batch_size)
        base = self._speed(job, w, 0, per_node)
        return base * 0.8 ** max(k - k_min, 0)

    def _place_aware(
        self,
        requests: dict[str, tuple[int, int]],
        jobs: Sequence[SimJob],
        cap: np.ndarray,
        per_node: int,
    ) -> dict[str, Placement]:
        """Placement of ``optimus+``: fewest servers, but a GPU job whose tasks would be
        fragmented takes the count (down to half) with the best estimated speed."""
        by_name = {j.name: j for j in jobs}
        out = place_requests(
            {n: r for n, r in requests.items() if not isinstance(by_name[n], GpuJob)},
            jobs,
            cap,
            mode="fewest",
        )
        free = cap.astype(float).copy()
        for n, pl in out.items():
            free -= pl.usage(by_name[n].worker_demand, by_name[n].ps_demand)
        gpu = {n: r for n, r in requests.items() if isinstance(by_name[n], GpuJob) and r[0] > 0}
        todo = []
        for n, (w, _p) in gpu.items():
            job = by_name[n]
            cur = job.placement
            if cur is not None and cur.num_workers == w:
                use = cur.usage(job.worker_demand, job.ps_demand)
                if np.all(use <= free + 1e-9):
                    free -= use
                    out[n] = cur
                    continue
            todo.append(n)
        todo.sort(key=lambda n: (-gpu[n][0], n))
        for n in todo:
            job = by_name[n]
            w = gpu[n][0]
            best: tuple[float, Placement] | None = None
            for cand in range(w, max(w // 2, 1) - 1, -1):
                pl = place_fewest(cand, 0, job.worker_demand, job.ps_demand, free, cap)
                if pl is None:
                    continue
                spd = self.speed_on(job, pl, per_node)
                if best is None or spd > best[0] * 1.0001:
                    best = (spd, pl)
                if pl.nodes_used <= -(-cand // per_node):
                    break  # compact: fewer GPUs cannot be faster
            if best is None:
                continue
            out[n] = best[1]
            free -= best[1].usage(job.worker_demand, job.ps_demand)
        return out

    def _fit_remaining(self, job: SimJob) -> tuple[float, float, float] | None:
        """Remaining steps from dynsched-optimus' convergence model (paper fit + extras).

        ``optimus``: the paper's fit (outlier band, no recency weighting, no decay
        detection), point estimate. ``optimus+``: recency weighting, learning-rate decay
        detection and a bootstrap prediction interval. GPU jobs end at a target metric:
        the remaining steps are those until the fitted curve reaches the target loss
        (else the ``delta`` rule); the interval is scaled from the ``delta`` interval.
        """
        steps = [p[0] for p in job.loss_points]
        losses = [max(p[1], 1e-9) for p in job.loss_points]
        epochs = list(range(1, len(steps) + 1))
        spe = max(job.steps_done / max(job.epochs_done, 1), 1.0)
        delta = float(getattr(job, "delta_conv", 0.002))
        cfg = ConvergenceConfig(
            delta=delta,
            interval=spe,
            recency_half_life=max(job.steps_done / 2.0, spe) if self.plus else None,
            detect_lr_decay=self.plus,
            b2_grid=16,
        )
        done = job.steps_done
        cap = 50.0 * max(done, spe)
        try:
            if self.plus:
                iv = opt_remaining_interval(
                    steps,
                    losses,
                    done,
                    epochs=epochs,
                    config=cfg,
                    confidence=0.6,
                    n_boot=16,
                    seed=len(steps),
                )
                fit, est, lo, hi = iv.fit, iv.estimate, iv.low, iv.high
            else:
                fit = opt_fit_convergence(steps, losses, epochs=epochs, config=cfg)
                est = lo = hi = fit.remaining_steps(done, delta, spe)
        except OptimusError:
            return None
        target = job.target_loss if isinstance(job, GpuJob) else None
        if target is not None:
            t = target / fit.loss_scale - fit.b2
            if t > 0 and fit.b0 > 0:
                k = fit.origin_step + (1.0 / t - fit.b1) / fit.b0
                tgt = max(k - done, 0.0)
                if est > 0:
                    lo, hi = tgt * lo / est, tgt * hi / est
                else:
                    lo = hi = tgt
                est = tgt
        est, lo, hi = (min(max(v, 0.0), cap) for v in (est, lo, hi))
        return est, min(lo, est), max(hi, est)

    def _speed(self, job: SimJob, w: int, p: int, per_node: int, batch: int | None = None) -> float:
        """Estimated (or true) steps per second with ``w`` workers and ``p`` PS."""
        key = (job.name, w, p, batch, len(job.speed_samples), self._tick)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._speed_uncached(job, w, p, per_node, batch)
        return hit

    def _speed_uncached(
        self, job: SimJob, w: int, p: int, per_node: int, batch: int | None
    ) -> float:
        if isinstance(job, GpuJob):
            if self.plus and self.extrapolation and job.speed_samples:
                # hedge: no extrapolation beyond a factor of the largest measured GPU count
                top = max(k[0] for k in job.speed_samples)
                w = min(w, max(int(self.extrapolation * top), 1), job.max_workers)
            shape = self._shape(job, w, per_node)
            b = batch or job.batch_size
            if self.oracle:
                return 1.0 / job.true_iter_time(shape, b)
            key = (w, 0, len(shape))
            if batch is None or batch == job.batch_size:
                m = job.measured_speed(key)
                if m is not None:
                    return m
            coef = self._speed_fit(job)
            if coef is None:
                # too few configurations measured: a prior shape anchored on the best-known
                # measurement (linear scaling; optimus+: sub-linear up to the submitted
                # GPU count, flat beyond)
                anchor = max(
                    job.speed_samples.items(), key=lambda kv: (len(kv[1]), kv[0]), default=None
                )
                n0 = anchor[0][0] if anchor else 1
                m0 = float(np.mean(anchor[1])) if anchor else 1.0
                return m0 * self._prior_shape(job, w) / self._prior_shape(job, n0)
            return 1.0 / predict_allreduce_time(coef, w, len(shape), b)
        if self.oracle:
            pl = self._ps_empty_placement(job, w, p, self._capacity)
            if pl is None:
                return 1e-9
            return job.true_speed(pl)
        coef = self._speed_fit(job)
        if coef is None:
            ms = [v for k, v in job.speed_samples.items() if k[0] == w and k[1] == p]
            return float(np.mean(ms[0])) if ms else 1e-9
        return float(coef.predict(max(p, 1), w))

    @staticmethod
    def _fit_ps(job: SimJob) -> object | None:
        """dynsched-optimus' synchronous PS speed model on the measured configurations."""
        if len(job.speed_samples) < 5:
            return None
        keys = list(job.speed_samples)
        try:
            return fit_speed(
                "sync",
                [max(k[1], 1) for k in keys],
                [k[0] for k in keys],
                [float(np.mean(job.speed_samples[k])) for k in keys],
                global_batch=float(job.batch_size),
            )
        except OptimusError:
            return None

    def _prior_shape(self, job: SimJob, n: int) -> float:
        if not self.plus:
            return float(n)
        r = max(job.requested_workers, 1)
        return float(min(n, r)) ** 0.9

    def _speed_fit(self, job: SimJob) -> Any:
        n = len(job.speed_samples) * 1000 + self._tick // 10
        c = self._speed_cache.get(job.name)
        if c is None or c[0] != n:
            if isinstance(job, GpuJob):
                coef = (
                    fit_allreduce_speed(job.speed_samples, job.batch_size)
                    if len(job.speed_samples) >= 3
                    else None
                )
            else:
                coef = self._fit_ps(job)
            self._speed_cache[job.name] = (n, coef)
            c = self._speed_cache[job.name]
        return c[1]

    def prediction_report(self, now: float, jobs: Sequence[SimJob]) -> tuple[float, float] | None:
        """Median relative speed and remaining-steps errors over running jobs."""
        if self.oracle:
            return None
        se, re = [], []
        for job in jobs:
            if job.placement is None or not job.loss_points:
                continue
            pl = job.placement
            per = int(max(self._capacity[:, 2].max(), 1))
            est = self.speed_on(job, pl, per)
            true = job.true_speed(pl)
            se.append(abs(est - true) / true)
            r_est = self.remaining_steps(job)[0]
            r_true = job.true_remaining_steps()
            if r_true > 0:
                re.append(abs(r_est - r_true) / r_true)
        if not se:
            return None
        return float(np.median(se)), float(np.median(re)) if re else float("nan")

    # ---------------------------------------------------------------- allocation
    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        self._tick += 1
        self._capacity = cluster.capacity
        if len(self._memo) > 200_000:
            self._memo.clear()
        cap = cluster.capacity
        total = cap.sum(axis=0)
        tot_safe = np.where(total > 0, total, np.inf)
        per_node = int(max(cap[:, 2].max(), 1)) if total[2] > 0 else 6
        free = total.astype(float).copy()
        rem: dict[str, float] = {}
        fitted: dict[str, bool] = {}
        batch: dict[str, int | None] = {}
        for job in jobs:
            est, lo, hi, ok = self.remaining_steps(job)
            if self.plus:
                est = {"low": lo, "high": hi, "mid": est}[self.hedge_quantile]
            rem[job.name] = max(est, 1.0)
            fitted[job.name] = ok
            batch[job.name] = None
        counts: dict[str, list[int]] = {}

        def t_of(job: SimJob, w: int, p: int) -> float:
            if w <= 0 or (isinstance(job, PSJob) and p <= 0):
                return math.inf
            return rem[job.name] / max(self._speed(job, w, p, per_node, batch[job.name]), 1e-12)

        by_name = {j.name: j for j in jobs}
        if self.plus:
            counts = self._allocate_plus(jobs, by_name, t_of, free, tot_safe, cluster)
        else:
            # PS jobs: the package's allocator; all-reduce (GPU) jobs have no PS, which it
            # does not model, so they keep the simulator's greedy. In a mixed job list
            # (none of the workload runners builds one) the PS jobs are served first.
            ps_jobs = [j for j in jobs if isinstance(j, PSJob)]
            others = [j for j in jobs if not isinstance(j, PSJob)]
            if ps_jobs:
                self._allocate_ps_package(ps_jobs, rem, fitted, per_node, free, counts)
            if others:
                self._allocate_optimus(others, by_name, t_of, free, tot_safe, fitted, counts)
        requests = {k: (v[0], v[1]) for k, v in counts.items()}
        if self.plus and self.placement_mode == "aware":
            out = self._place_aware(requests, jobs, cap, per_node)
        elif self.placement_mode == "fewest":
            # parameter-server jobs: dynsched-optimus' ``place`` (Theorem 1); all-reduce
            # jobs have no PS and keep the simulator's placement (with its fill fallback),
            # on the capacity the PS jobs left
            ps_req = {n: r for n, r in requests.items() if isinstance(by_name[n], PSJob)}
            rest = {n: r for n, r in requests.items() if n not in ps_req}
            out = self._place_ps_package(ps_req, by_name, cap) if ps_req else {}
            if rest:
                left = cap - sum(
                    (
                        pl.usage(by_name[n].worker_demand, by_name[n].ps_demand)
                        for n, pl in out.items()
                    ),
                    np.zeros_like(cap, dtype=float),
                )
                out.update(place_requests(rest, jobs, cap, mode="fewest", free=left))
                out = _shrink_unplaced(rest, out, jobs, cluster, "fewest")
        else:
            out = place_requests(requests, jobs, cap, mode=self.placement_mode)
            out = _shrink_unplaced(requests, out, jobs, cluster, self.placement_mode)
        if self.adapt_batch:
            for name, pl in out.items():
                job = by_name[name]
                if isinstance(job, GpuJob):
                    b = self._best_batch(job, pl.num_workers, per_node)
                    if b is not None and b != job.batch_size:
                        out[name] = Placement(pl.workers, pl.ps, batch_size=b)
        return out

    def _allocate_ps_package(
        self,
        jobs: Sequence[SimJob],
        rem: dict[str, float],
        fitted: dict[str, bool],
        per_node: int,
        free: np.ndarray,
        counts: dict[str, list[int]],
    ) -> None:
        """The paper's greedy for parameter-server jobs: dynsched-optimus' ``allocate``.

        One :class:`AllocationJob` per job: the estimated remaining steps, the fitted
        :class:`PSSpeedModel` (vectorised path) or, before a fit exists and for the
        oracle, a callable on this scheduler's speed estimate (true speed on the
        fewest-servers placement for the oracle), damped while the convergence fit is
        missing. Starter tasks go in the package's order (ascending dominant share of the
        1 PS + 1 worker bundle, ties by name). ``free`` and ``counts`` are updated.
        """
        ajobs = []
        for job in jobs:
            coef = None if self.oracle else self._speed_fit(job)
            if isinstance(coef, PSSpeedModel):
                speed: PSSpeedModel | Callable[[int, int], float] = coef
            else:
                speed = functools.partial(self._speed_pw, job, per_node)
            ajobs.append(
                AllocationJob(
                    job_id=job.name,
                    remaining_steps=rem[job.name],
                    speed=speed,
                    ps_demand=tuple(job.ps_demand),
                    worker_demand=tuple(job.worker_demand),
                    damped=not fitted[job.name],
                    max_ps=max(job.max_ps, 1),
                    max_workers=max(job.max_workers, 1),
                )
            )
        res = allocate(ajobs, tuple(free), damping=self.damping)
        for job in jobs:
            p, w = res.tasks[job.name]
            if w > 0 and p > 0:
                counts[job.name] = [w, p]
                free -= _demand(job, w, p)

    def _speed_pw(self, job: SimJob, per_node: int, p: int, w: int) -> float:
        """:meth:`_speed` with the allocator's argument order ``f(p, w)``."""
        return self._speed(job, w, p, per_node)

    def _place_ps_package(
        self,
        requests: dict[str, tuple[int, int]],
        by_name: dict[str, SimJob],
        cap: np.ndarray,
        *,
        keep: bool = True,
    ) -> dict[str, Placement]:
        """Fewest-servers even placement of PS jobs by dynsched-optimus' ``place``.

        Jobs with unchanged task counts keep their placement when it still fits; a job
        that fits nowhere is retried with one task fewer at a time (``shrink=True``).
        """
        n_nodes = cap.shape[0]
        reqs = []
        previous: dict[str, JobPlacement] = {}
        for name, (w, p) in requests.items():
            job = by_name[name]
            reqs.append(
                PlacementRequest(
                    job_id=name,
                    ps=p,
                    workers=w,
                    ps_demand=tuple(job.ps_demand),
                    worker_demand=tuple(job.worker_demand),
                )
            )
            cur = job.placement
            if keep and cur is not None:
                nodes = tuple(i for i in range(n_nodes) if cur.workers[i] or cur.ps[i])
                previous[name] = JobPlacement(
                    job_id=name,
                    nodes=nodes,
                    ps_per_node=tuple(cur.ps[i] for i in nodes),
                    workers_per_node=tuple(cur.workers[i] for i in nodes),
                )
        res = place(reqs, cap, previous=previous, shrink=True)
        out: dict[str, Placement] = {}
        for name, jp in res.placements.items():
            cur = by_name[name].placement
            if keep and name in res.kept and cur is not None:
                out[name] = cur
                continue
            ws = [0] * n_nodes
            ps = [0] * n_nodes
            for nd, pp, ww in zip(jp.nodes, jp.ps_per_node, jp.workers_per_node, strict=True):
                ws[nd] += ww
                ps[nd] += pp
            out[name] = Placement(ws, ps)
        return out

    def _ps_empty_placement(self, job: SimJob, w: int, p: int, cap: np.ndarray) -> Placement | None:
        """Where Optimus places ``w`` workers and ``p`` PS on an empty cluster (cached)."""
        key = (w, p, tuple(job.worker_demand), tuple(job.ps_demand), cap.shape, cap.tobytes())
        if key not in self._empty_pl:
            out = self._place_ps_package({job.name: (w, p)}, {job.name: job}, cap, keep=False)
            self._empty_pl[key] = out.get(job.name)
        return self._empty_pl[key]

    def _allocate_optimus(
        self,
        jobs: Sequence[SimJob],
        by_name: dict[str, SimJob],
        t_of: Callable[[SimJob, int, int], float],
        free: np.ndarray,
        tot_safe: np.ndarray,
        fitted: dict[str, bool],
        counts: dict[str, list[int]],
    ) -> None:
        """The paper's greedy for GPU all-reduce jobs: 1 GPU each, then largest gain first.

        Kept separate from dynsched-optimus' ``allocate`` (used for PS jobs): that
        allocator models parameter-server jobs only (every job gets a ``1 PS + 1 worker``
        starter bundle with a positive PS demand), while an all-reduce job has no PS. Its
        starter order is submission order (the Pollux artifact's Optimus), not the
        package's ascending dominant share.
        """
        first = sorted(jobs, key=lambda j: (j.submit_time, j.name))
        for job in first:
            w0, p0 = _min_tasks(job)
            need = _demand(job, w0, p0)
            if np.all(need <= free + 1e-9):
                counts[job.name] = [w0, p0]
                free -= need

        def gains(job: SimJob) -> list[tuple[float, int, int]]:
            w, p = counts[job.name]
            cur = t_of(job, w, p)
            out = []
            opts = [(1, 0)] + ([(0, 1)] if isinstance(job, PSJob) else [])
            for dw, dp in opts:
                if w + dw > job.max_workers or p + dp > max(job.max_ps, 0):
                    continue
                new = t_of(job, w + dw, p + dp)
                g = cur - new
                if self.shortest_weight:
                    g /= max(new, 1.0) ** self.shortest_weight
                d = float(np.max(_demand(job, dw, dp) / tot_safe))
                g /= max(d, 1e-12)
                if not fitted[job.name]:
                    g *= self.damping
                out.append((g, dw, dp))
            return out

        heap: list[tuple[float, float, str, int, int]] = []
        for name in counts:
            job = by_name[name]
            g = gains(job)
            if g:
                best = max(g)
                if best[0] > 0:
                    heap.append((-best[0], job.submit_time, name, best[1], best[2]))
        heapq.heapify(heap)
        while heap:
            _, _, name, dw, dp = heapq.heappop(heap)
            job = by_name[name]
            need = _demand(job, dw, dp)
            if not np.all(need <= free + 1e-9):
                # try the other task kind, else drop this job from the loop
                alt = [g for g in gains(job) if (g[1], g[2]) != (dw, dp) and g[0] > 0]
                alt = [g for g in alt if np.all(_demand(job, g[1], g[2]) <= free + 1e-9)]
                if alt:
                    b = max(alt)
                    heapq.heappush(heap, (-b[0], job.submit_time, name, b[1], b[2]))
                continue
            free -= need
            counts[name][0] += dw
            counts[name][1] += dp
            g = gains(job)
            if g:
                best = max(g)
                if best[0] > 0:
                    heapq.heappush(heap, (-best[0], job.submit_time, name, best[1], best[2]))

    def _allocate_plus(
        self,
        jobs: Sequence[SimJob],
        by_name: dict[str, SimJob],
        t_of: Callable[[SimJob, int, int], float],
        free: np.ndarray,
        tot_safe: np.ndarray,
        cluster: ClusterState,
    ) -> dict[str, list[int]]:
        """``optimus+`` allocation: incremental, restart-aware, on ``sum F(T_j)``.

        ``F(T) = log T`` (``shortest_weight = 1``: time saved per unit of occupied
        resource-time) or ``T**(1 - a) / (1 - a)``.

        Start from the current tasks; waiting jobs (shortest estimated time first) get
        their minimum from free capacity or from the running job that loses least; then
        one task at a time goes to the largest gain ``F(T(now)) - F(T(new) + pen)``
        per dominant share, where ``pen = hysteresis * restart_delay`` is charged once
        per job whose tasks change; a task is taken from another job only when the
        gain exceeds that job's loss (with its own restart penalty).
        """
        pen = self.hysteresis * cluster.restart_delay_s
        counts: dict[str, list[int]] = {}
        current: dict[str, tuple[int, int]] = {}
        for job in jobs:
            if job.placement is not None:
                c = (job.placement.num_workers, job.placement.num_ps)
                counts[job.name] = [c[0], c[1]]
                current[job.name] = c
                free -= _demand(job, *c)
        changed: set[str] = set()

        a = self.shortest_weight

        def logt(job: SimJob, w: int, p: int, extra: float = 0.0) -> float:
            # utility F(T): log T for a = 1, T**(1 - a) / (1 - a) otherwise
            t = t_of(job, w, p)
            if not math.isfinite(t):
                return 1e18
            t = max(t + extra, 1e-9)
            return math.log(t) if a == 1.0 else t ** (1.0 - a) / (1.0 - a)

        def share(job: SimJob, dw: int, dp: int) -> float:
            return max(float(np.max(_demand(job, dw, dp) / tot_safe)), 1e-12)

        def penalty(name: str) -> float:
            return pen if (name in current and name not in changed) else 0.0

        def loss_of(job: SimJob, dw: int, dp: int) -> float:
            w, p = counts[job.name]
            mw, mp = _min_tasks(job)
            if w - dw < mw or p - dp < mp:
                return math.inf
            return (logt(job, w - dw, p - dp, penalty(job.name)) - logt(job, w, p)) / share(
                job, dw, dp
            )

        def take(need: np.ndarray, exclude: str, budget: float) -> bool:
            """Free ``need`` by removing tasks of jobs losing less than ``budget`` in total."""
            nonlocal free
            plan: list[tuple[str, int, int]] = []
            trial = free.copy()
            spent = 0.0
            saved = {k: list(v) for k, v in counts.items()}
            while not np.all(need <= trial + 1e-9):
                best = None
                for name, (w, p) in counts.items():
                    if name == exclude:
                        continue
                    dj = by_name[name]
                    for dw, dp in ((1, 0), (0, 1)):
                        if (dw and w <= 1) or (dp and p <= (1 if dj.max_ps else 0)):
                            continue
                        dneed = _demand(dj, dw, dp)
                        short = np.maximum(need - trial, 0.0)
                        if not np.any(np.minimum(dneed, short) > 0):
                            continue
                        loss = loss_of(dj, dw, dp) * share(dj, dw, dp)
                        if best is None or loss < best[0]:
                            best = (loss, name, dw, dp)
                if best is None or spent + best[0] >= budget:
                    for k, v in saved.items():
                        counts[k] = v
                    return False
                loss, name, dw, dp = best
                spent += loss
                counts[name][0] -= dw
                counts[name][1] -= dp
                trial += _demand(by_name[name], dw, dp)
                plan.append((name, dw, dp))
            free = trial
            changed.update(n for n, _, _ in plan)
            return True

        waiting = [j for j in jobs if j.name not in counts]
        waiting.sort(key=lambda j: (t_of(j, *_min_tasks(j)), j.submit_time, j.name))
        for job in waiting:
            w0, p0 = _min_tasks(job)
            need = _demand(job, w0, p0)
            if not np.all(need <= free + 1e-9) and not take(need, job.name, math.inf):
                continue
            free -= need
            counts[job.name] = [w0, p0]
            changed.add(job.name)

        def best_gain(job: SimJob) -> tuple[float, int, int] | None:
            w, p = counts[job.name]
            base = logt(job, w, p)
            out = None
            opts = [(1, 0)] + ([(0, 1)] if job.max_ps > 0 else [])
            for dw, dp in opts:
                if w + dw > job.max_workers or p + dp > max(job.max_ps, 0):
                    continue
                pj = penalty(job.name)
                g = base - logt(job, w + dw, p + dp, pj)
                if pj > 0:
                    # a restart is paid once: credit the best of up to 4 more tasks
                    for m in range(2, 5):
                        if w + m * dw > job.max_workers or p + m * dp > max(job.max_ps, 0):
                            break
                        g = max(g, (base - logt(job, w + m * dw, p + m * dp, pj)) / m)
                if g < self.min_gain:
                    continue  # not worth a task that another job may need later
                g /= share(job, dw, dp)
                if out is None or g > out[0]:
                    out = (g, dw, dp)
            return out

        heap: list[tuple[float, float, str, int, int]] = []
        for name in counts:
            job = by_name[name]
            g = best_gain(job)
            if g is not None and g[0] > 0:
                heap.append((-g[0], job.submit_time, name, g[1], g[2]))
        heapq.heapify(heap)
        moves = 0
        limit = 4 * int(max(tot_safe[np.isfinite(tot_safe)].max(), 1.0)) + 4 * len(jobs)
        while heap and moves < limit:
            neg, _, name, dw, dp = heapq.heappop(heap)
            job = by_name[name]
            g = best_gain(job)
            if g is None or g[0] <= 0:
                continue
            if abs(-neg - g[0]) > 1e-12 * max(1.0, abs(g[0])):
                heapq.heappush(heap, (-g[0], job.submit_time, name, g[1], g[2]))
                continue
            moves += 1
            need = _demand(job, dw, dp)
            if not np.all(need <= free + 1e-9) and not take(need, name, g[0] * share(job, dw, dp)):
                continue
            free -= need
            counts[name][0] += dw
            counts[name][1] += dp
            changed.add(name)
            g = best_gain(job)
            if g is not None and g[0] > 0:
                heapq.heappush(heap, (-g[0], job.submit_time, name, g[1], g[2]))
        return counts

    def _best_batch(self, job: GpuJob, n: int, per_node: int) -> int | None:
        """Batch maximising estimated goodput (efficiency / iteration time) on ``n`` GPUs."""
        if job.grad_stats is None:
            return None
        sqr, var = job.grad_stats
        lo, hi = job.batch_limits()
        b0 = job.profile.init_batch_size
        cands = sorted({int(job.spec.batch_size), *[int(b) for b in job.profile.batch_sizes]})
        best, best_val = None, -math.inf
        for b in cands:
            if b < lo or b > hi or n > job.max_workers_for(b) or b < job.spec.batch_size:
                continue
            scale = b / b0
            eff = (var + sqr) / (var / scale + sqr)
            t = 1.0 / max(self._speed(job, n, 0, per_node, b), 1e-12)
            val = eff / t
            if val > best_val:
                best, best_val = b, val
        return best


#: Registered scheduler names and their factories.
SCHEDULERS: dict[str, Callable[..., _Base]] = {
    "fifo": FIFOScheduler,
    "drf": DRFScheduler,
    "tetris": TetrisScheduler,
    "srtf": SRTFScheduler,
    "tiresias": TiresiasScheduler,
    "optimus": lambda **kw: OptimusScheduler(**kw),
    "optimus-oracle": lambda **kw: OptimusScheduler(oracle=True, **kw),
    "optimus+": lambda **kw: OptimusScheduler(plus=True, **kw),
}


def make_scheduler(name: str, **kwargs: object) -> _Base:
    """Build a scheduler by name (one of :data:`SCHEDULERS`)."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r}: allowed values are {sorted(SCHEDULERS)}")
    return SCHEDULERS[name](**kwargs)
