"""The discrete-time cluster simulator."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import numpy as np

from ._jobs import SimJob
from ._spec import ClusterSpec, Placement, SimConfig

__all__ = [
    "ClusterScheduler",
    "ClusterState",
    "OverCommitError",
    "SimResult",
    "Simulator",
]


class OverCommitError(RuntimeError):
    """A scheduler returned placements that exceed a node's capacity or a job's limits
    (most workers at the batch it trains with, allowed batch sizes)."""


@attrs.frozen
class ClusterState:
    """What a scheduler sees of the cluster.

    Attributes:
        spec: the cluster.
        capacity: ``(num_nodes, 4)`` capacity matrix.
        interval_s: scheduling interval.
        restart_delay_s: pause after a placement change.
    """

    spec: ClusterSpec
    capacity: np.ndarray
    interval_s: float
    restart_delay_s: float


class ClusterScheduler(Protocol):
    """A scheduling policy: maps active jobs to placements every interval."""

    name: str

    def schedule(
        self, now: float, jobs: Sequence[SimJob], cluster: ClusterState
    ) -> dict[str, Placement]:
        """Placements for the jobs that should run (absent or empty = not running)."""
        ...


@attrs.frozen
class SimResult:
    """Outcome of one simulation.

    Attributes:
        scheduler: scheduler name.
        jct: per-job completion time (seconds from submission).
        makespan: last completion minus first submission.
        gpu_utilization: allocated GPU-seconds / (GPUs x makespan) (0 without GPUs).
        task_utilization: allocated dominant-resource share integrated over time / makespan.
        overhead_share: restart-paused job-seconds / job-seconds holding resources.
        restarts: restarts per job.
        timeline: per interval ``(time, running_jobs, queued_jobs, gpus_used)``.
        allocations: per job the list of ``(time, workers, ps)`` changes.
        prediction_errors: per interval ``(time, speed_rel_err, steps_rel_err)`` medians
            over running jobs, when the scheduler reports predictions.
        wall_s: wall-clock seconds the simulation took.
        simulated_s: simulated seconds.
        unfinished: jobs that did not complete before ``max_time_s``.
        batches: per job the list of ``(time, global batch)`` changes (the first entry:
            the batch it started with), for jobs whose batch a scheduler changed.
    """

    scheduler: str
    jct: dict[str, float]
    makespan: float
    gpu_utilization: float
    task_utilization: float
    overhead_share: float
    restarts: dict[str, int]
    timeline: list[tuple[float, int, int, int]]
    allocations: dict[str, list[tuple[float, int, int]]]
    prediction_errors: list[tuple[float, float, float]]
    wall_s: float
    simulated_s: float
    unfinished: tuple[str, ...] = ()
    batches: dict[str, list[tuple[float, int]]] = attrs.field(factory=dict)

    @property
    def avg_jct(self) -> float:
        """Mean JCT over completed jobs."""
        return float(np.mean(list(self.jct.values()))) if self.jct else float("nan")

    @property
    def p99_jct(self) -> float:
        """99th percentile JCT."""
        return float(np.percentile(list(self.jct.values()), 99)) if self.jct else float("nan")

    def summary(self) -> dict[str, float | str | int]:
        """Flat dict of the headline figures."""
        return {
            "scheduler": self.scheduler,
            "jobs": len(self.jct),
            "avg_jct_s": round(self.avg_jct, 1),
            "p99_jct_s": round(self.p99_jct, 1),
            "makespan_s": round(self.makespan, 1),
            "gpu_util": round(self.gpu_utilization, 4),
            "task_util": round(self.task_utilization, 4),
            "overhead_share": round(self.overhead_share, 4),
            "restarts": int(sum(self.restarts.values())),
            "wall_s": round(self.wall_s, 2),
            "wall_s_per_sim_hour": round(self.wall_s / max(self.simulated_s / 3600, 1e-9), 4),
        }


class Simulator:
    """Discrete-time simulator: every ``interval_s`` the scheduler places the active jobs.

    Jobs submitted inside an interval wait for the next boundary (a rounding of at most
    one interval); completions inside an interval are exact (the job's resources are
    released at the next boundary). A job whose tasks change (not the batch size alone)
    pauses for ``restart_delay_s`` of its held time (or what :meth:`SimJob.pause_s`
    answers: a measured job's own start-up and re-allocation costs).

    Args:
        cluster: the servers.
        jobs: the jobs (fresh, not yet run).
        scheduler: the policy.
        config: interval, restart delay, limits.
        progress: optional callback ``(now, done, total)`` called every interval.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        jobs: Sequence[SimJob],
        scheduler: ClusterScheduler,
        config: SimConfig | None = None,
        progress: Callable[[float, int, int], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.jobs = list(jobs)
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        self.scheduler = scheduler
        self.config = config or SimConfig()
        self.progress = progress
        self.capacity = cluster.capacity()
        self.state = ClusterState(
            spec=cluster,
            capacity=self.capacity,
            interval_s=self.config.interval_s,
            restart_delay_s=self.config.restart_delay_s,
        )

    def check_placements(self, decisions: dict[str, Placement], by_name: dict[str, SimJob]) -> None:
        """Raise :class:`OverCommitError` when ``decisions`` exceed a node's capacity."""
        used = np.zeros_like(self.capacity)
        n = self.cluster.num_nodes
        for name, pl in decisions.items():
            job = by_name.get(name)
            if job is None:
                raise OverCommitError(f"placement for unknown or inactive job {name!r}")
            if len(pl.workers) != n:
                raise OverCommitError(
                    f"job {name!r}: placement has {len(pl.workers)} nodes, not {n}"
                )
            if pl.batch_size and pl.batch_size != job.batch_size:
                if not job.adaptive:
                    raise OverCommitError(
                        f"job {name!r}: batch_size={pl.batch_size}, but its batch is fixed "
                        f"at {job.batch_size}"
                    )
                lo, hi = job.batch_limits()  # type: ignore[attr-defined]
                if not lo <= pl.batch_size <= hi:
                    raise OverCommitError(
                        f"job {name!r}: batch_size={pl.batch_size} is outside the allowed "
                        f"range [{lo}, {hi}]"
                    )
            max_w = job.max_workers_for(pl.batch_size)
            if pl.num_workers > max_w or pl.num_ps > max(job.max_ps, 0):
                raise OverCommitError(
                    f"job {name!r}: {pl.num_workers} workers / {pl.num_ps} PS exceed the job's "
                    f"limits {max_w} / {job.max_ps} (at batch "
                    f"{pl.batch_size or job.batch_size})"
                )
            used += pl.usage(job.worker_demand, job.ps_demand)
        over = used > self.capacity + 1e-9
        if over.any():
            node, res = np.argwhere(over)[0]
            raise OverCommitError(
                f"node {node} over-committed in resource {res}: {used[node, res]} > "
                f"{self.capacity[node, res]}"
            )

    def _prerun(self, job: SimJob, now: float) -> None:
        fn = getattr(self.scheduler, "prerun_configs", None)
        if fn is None:
            return
        configs = fn(job, self.capacity)
        for pl in configs:
            job.record_speed(pl, job.true_speed(pl))
        job.ready_time = now + len(configs) * float(getattr(self.scheduler, "prerun_s", 0.0))

    def run(self) -> SimResult:
        """Run until every job completed (or ``max_time_s``)."""
        cfg = self.config
        wall0 = time.perf_counter()
        jobs = sorted(self.jobs, key=lambda j: (j.submit_time, j.name))
        tally = _Tally(jobs, self.capacity)
        now = 0.0
        idx = 0
        active: list[SimJob] = []
        while tally.n_done < len(jobs) and now < cfg.max_time_s:
            idx = self._admit(jobs, idx, now, active)
            runnable = [j for j in active if j.ready_time <= now]
            if not runnable and idx < len(jobs) and not active:
                # Skip idle time to the next interval boundary at or after the next arrival.
                nxt = jobs[idx].submit_time
                now = max(now + cfg.interval_s, np.ceil(nxt / cfg.interval_s) * cfg.interval_s)
                continue
            gpus_used = self._apply_decisions(self._decide(now, runnable), runnable, now, tally)
            self._report_prediction(now, runnable, tally)
            running = self._advance(runnable, now, tally)
            tally.timeline.append((now, running, len(active) - running, gpus_used))
            active = [j for j in active if not j.done]
            now += cfg.interval_s
            if self.progress is not None:
                self.progress(now, tally.n_done, len(jobs))
        return self._result(jobs, tally, now, time.perf_counter() - wall0)

    def _admit(self, jobs: list[SimJob], idx: int, now: float, active: list[SimJob]) -> int:
        """Append to ``active`` the jobs submitted by ``now``; the index of the next one."""
        while idx < len(jobs) and jobs[idx].submit_time <= now:
            self._prerun(jobs[idx], now)
            active.append(jobs[idx])
            idx += 1
        return idx

    def _decide(self, now: float, runnable: list[SimJob]) -> dict[str, Placement]:
        """The scheduler's non-empty placements, checked against the cluster."""
        decisions = self.scheduler.schedule(now, runnable, self.state) if runnable else {}
        decisions = {k: v for k, v in decisions.items() if v.num_workers + v.num_ps > 0}
        self.check_placements(decisions, {j.name: j for j in runnable})
        return decisions

    def _apply_decisions(
        self, decisions: dict[str, Placement], runnable: list[SimJob], now: float, tally: _Tally
    ) -> int:
        """Set each runnable job's batch and placement; the GPUs the placed jobs hold."""
        gpus_used = 0
        for job in runnable:
            new = decisions.get(job.name)
            if new is not None and new.batch_size and new.batch_size != job.batch_size:
                hist = tally.batches.setdefault(job.name, [(job.submit_time, job.batch_size)])
                job.set_batch_size(int(new.batch_size))
                hist.append((now, job.batch_size))
            if new is None:
                if job.placement is not None:
                    job.placement = None
                    job.restart_left = 0.0
                    tally.allocs[job.name].append((now, 0, 0))
                continue
            placement = self._place(job, new, now, tally)
            gpus_used += round(float(placement.usage(job.worker_demand, job.ps_demand)[:, 2].sum()))
        return gpus_used

    def _place(self, job: SimJob, new: Placement, now: float, tally: _Tally) -> Placement:
        """Give ``job`` the placement ``new``: a change of tasks pauses (and counts a restart)."""
        placement = job.placement
        if placement is None or not new.same_tasks(placement):
            placement = job.placement = Placement(new.workers, new.ps)
            job.restart_left = job.pause_s(self.config.restart_delay_s)
            job.pause_is_restart = job.start_time is not None
            if job.start_time is not None:
                job.num_restarts += 1
            tally.allocs[job.name].append((now, new.num_workers, new.num_ps))
        if job.start_time is None:
            job.start_time = now
        return placement

    def _report_prediction(self, now: float, runnable: list[SimJob], tally: _Tally) -> None:
        """Record the scheduler's prediction errors when it reports them."""
        reporter = getattr(self.scheduler, "prediction_report", None)
        if reporter is not None:
            err = reporter(now, runnable)
            if err is not None:
                tally.pred_err.append((now, err[0], err[1]))

    def _advance(self, runnable: list[SimJob], now: float, tally: _Tally) -> int:
        """Advance the placed jobs one interval; the number of jobs that ran."""
        running = 0
        for job in runnable:
            if job.placement is None:
                continue
            running += 1
            used = job.advance(self.config.interval_s, now)
            u = job.placement.usage(job.worker_demand, job.ps_demand).sum(axis=0)
            tally.gpu_seconds += used * u[2]
            tally.dom_seconds += used * float(np.max(u / tally.cap_tot_safe))
            if job.done:
                tally.n_done += 1
                job.placement = None
        return running

    def _result(self, jobs: list[SimJob], tally: _Tally, now: float, wall_s: float) -> SimResult:
        """The figures of a finished run."""
        jct = {
            j.name: j.completion_time - j.submit_time for j in jobs if j.completion_time is not None
        }
        last = max((j.completion_time for j in jobs if j.completion_time is not None), default=now)
        first_submit = jobs[0].submit_time if jobs else 0.0
        makespan = max(last - first_submit, 1e-9)
        held = sum(j.held_seconds for j in jobs)
        restart = sum(j.restart_seconds for j in jobs)
        total_gpus = self.cluster.total_gpus
        return SimResult(
            scheduler=getattr(self.scheduler, "name", type(self.scheduler).__name__),
            jct=jct,
            makespan=makespan,
            gpu_utilization=tally.gpu_seconds / (total_gpus * makespan) if total_gpus else 0.0,
            task_utilization=tally.dom_seconds / makespan,
            overhead_share=restart / held if held > 0 else 0.0,
            restarts={j.name: j.num_restarts for j in jobs},
            timeline=tally.timeline,
            allocations=tally.allocs,
            prediction_errors=tally.pred_err,
            wall_s=wall_s,
            simulated_s=now,
            unfinished=tuple(j.name for j in jobs if j.completion_time is None),
            batches=tally.batches,
        )


class _Tally:
    """What a run accumulates: completions, timelines and resource-seconds."""

    def __init__(self, jobs: list[SimJob], capacity: np.ndarray) -> None:
        cap_tot = capacity.sum(axis=0)
        self.cap_tot_safe = np.where(cap_tot > 0, cap_tot, np.inf)
        self.n_done = 0
        self.gpu_seconds = 0.0
        self.dom_seconds = 0.0
        self.timeline: list[tuple[float, int, int, int]] = []
        self.allocs: dict[str, list[tuple[float, int, int]]] = {j.name: [] for j in jobs}
        self.pred_err: list[tuple[float, float, float]] = []
        self.batches: dict[str, list[tuple[float, int]]] = {}
