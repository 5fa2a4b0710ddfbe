"""``dynsched optimus serve``: the Optimus scheduler running real jobs on a Ray cluster.

Every ``interval_s`` the service builds one observation record per runnable job from what
its workers reported (:meth:`JobStore.record` -> :func:`~dynsched_optimus.jobs.observe_record`,
the record the simulator builds for its jobs), asks the scheduler
(:func:`~dynsched_optimus.jobs.make_decider`: the Optimus family's
``OptimusPolicy.schedule``, the simulator's code path) and applies the answer:

* a queued job that got workers starts (a :class:`WorkerGroup` of that size, restored
  from its last checkpoint);
* a running job whose workers change is asked to checkpoint and stop, then restarts at
  the new size (checkpoint-restart re-allocation, as in the paper);
* a job the scheduler gives a new batch (``optimus+`` on a job with ``adaptive_batch``)
  gets it without a restart when its placement stays and its file says
  ``batch_change: in_place``: its ranks are told and switch at a step they agree on
  (:class:`~dynsched_optimus.jobs.JobContext`), the switch is recorded
  (:meth:`JobStore.batch_changes`); otherwise it restarts from its checkpoint with it;
* between decisions the service polls the workers: reports, throughput and checkpoints go
  to the store; a finished job frees its workers, a raising script fails its job with
  one line, a dead worker or node restarts its job from its last checkpoint, a job that
  reports nothing for ``report_timeout_s`` fails with a clear line. Other jobs go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import (
    MIN_SPEED_REPORTS,
    ContextOptions,
    Decider,
    JobSpec,
    make_decider,
    observe_record,
    silent_error,
)

from dynsched_ray.optimus.executor import WorkerGroup, cluster_nodes, node_labels
from dynsched_ray.optimus.store import ACTIVE_STATES, JobRow, JobStore

__all__ = ["OptimusService", "ServiceOptions"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class ServiceOptions:
    """How the service schedules (plain data).

    Attributes:
        scheduler: one of :data:`dynsched_optimus.jobs.DECIDERS`.
        interval_s: seconds between scheduling decisions.
        restart_delay_s: what a re-allocation costs a job (the policy's penalty).
        checkpoint_root: directory of the jobs' checkpoints (one folder per job).
        poll_s: seconds between polls of the workers.
    """

    scheduler: str = "optimus+"
    interval_s: float = 10.0
    restart_delay_s: float = 5.0
    checkpoint_root: str = "optimus-checkpoints"
    poll_s: float = 0.5


class OptimusService:
    """Runs the jobs of a :class:`JobStore` on the connected Ray cluster.

    Args:
        store: the job table (jobs not done when the service starts are resumed).
        options: scheduler, interval, checkpoint places.
        on_line: where one-line notices go (job failed, restarted, finished).
        decider: replaces ``options.scheduler``'s decision function (tests, experiments).
        clock: the scheduler's clock (wall-clock seconds, like the submission times).
    """

    def __init__(
        self,
        store: JobStore,
        options: ServiceOptions,
        on_line: Callable[[str], None] = logger.warning,
        *,
        decider: Decider | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.options = options
        self.decide = decider or make_decider(options.scheduler)
        self.clock = clock
        self.say = on_line
        self.groups: dict[str, WorkerGroup] = {}
        self._heard: dict[str, float] = {}
        self._next_decision = 0.0
        self._resized_at: dict[str, float] = {}
        # batch decided for a job's next run, with how it changes (restart or start): the
        # change is recorded when that run starts, at the step it resumes from
        self._next_batch: dict[str, tuple[int, str]] = {}
        self.decisions = 0
        #: re-allocations made, and the seconds from each stop request to the first
        #: report at the new size (the re-allocation overhead the paper measures)
        self.reallocations = 0
        self.reallocation_s = 0.0
        #: batch changes applied without a restart
        self.in_place_changes = 0
        for row in store.jobs(("running", "stopping")):
            store.update(row.name, state="queued", placement=None, restarts=row.restarts + 1)
            self.say(f"job {row.name!r}: resumed from its last checkpoint after a service restart")

    # -------------------------------------------------------------- the loop
    def step(self) -> None:
        """One poll of every job, the cancellations, and a decision when one is due."""
        for name in list(self.groups):
            self._poll(name)
        self._cancel()
        if time.monotonic() >= self._next_decision:
            self._schedule()
            self._next_decision = time.monotonic() + self.options.interval_s

    def run(self, timeout_s: float | None = None, until_idle: bool = True) -> bool:
        """Step until no job is active (``until_idle``) or ``timeout_s`` passes.

        Returns:
            Whether every job is done.
        """
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self.step()
            idle = not self.store.jobs(ACTIVE_STATES)
            if (idle and until_idle) or (end is not None and time.monotonic() >= end):
                return idle
            time.sleep(self.options.poll_s)

    def shutdown(self) -> None:
        """Release every worker (jobs stay in the store and resume on the next start)."""
        for g in self.groups.values():
            g.release()
        self.groups.clear()

    # -------------------------------------------------------------- polling
    def _poll(self, name: str) -> None:
        g = self.groups[name]
        events = g.poll()
        now = time.monotonic()
        reports = [e for e in events if e["kind"] == "report"]
        if reports:
            self._heard[name] = now
            if g.first_step > 0 and name in self._resized_at:
                self.reallocation_s += now - self._resized_at.pop(name)
            self.store.add_reports(name, reports)
            self._speed(g, reports)
        for e in events:
            if e["kind"] == "checkpoint":
                self.store.add_checkpoint(name, int(e["step"]), str(e["path"]), float(e["t"]))
            elif e["kind"] == "batch":
                self._switched(name, e)
        if g.started_at is not None:
            self._heard.setdefault(name, now)
        row = self._row(name)
        if g.dead is not None:
            self._end_run(name, "queued", restarts=row.restarts + 1)
            self.say(f"job {name!r}: a worker died ({g.dead}); restarting from its last checkpoint")
        elif g.error is not None:
            self._end_run(name, "failed", error=g.error, ended=time.time())
            self.say(f"job {name!r} failed: {g.error}")
        elif g.done:
            finished = bool(g.exits[0].get("finished"))
            self._end_run(
                name, "finished" if finished else "queued", ended=time.time() if finished else None
            )
        elif g.started_at is not None and now - self._heard[name] > row.spec.report_timeout_s:
            line = silent_error(row.spec)
            self._end_run(name, "failed", error=line, ended=time.time())
            self.say(line)

    def _speed(self, g: WorkerGroup, reports: list[dict[str, Any]]) -> None:
        """Add the run's steady step times (its first step is start-up), by the batch each
        step trained with; every :data:`MIN_SPEED_REPORTS` of one batch make one throughput
        sample, however many polls they took to arrive (a slow machine may deliver one
        report per poll)."""
        for e in reports:
            if int(e["step"]) > g.first_step + 1:
                g.step_times.setdefault(int(e.get("batch", g.batch)), []).append(float(e["dt"]))
        pl = g.placement
        for batch, dts in g.step_times.items():
            while len(dts) >= MIN_SPEED_REPORTS:
                block = dts[:MIN_SPEED_REPORTS]
                del dts[:MIN_SPEED_REPORTS]
                if sum(block) > 0:
                    speed = MIN_SPEED_REPORTS / sum(block)
                    self.store.add_speed(g.spec.name, pl.workers, pl.num_servers, batch, speed)

    def _switched(self, name: str, event: dict[str, Any]) -> None:
        """A job's ranks switched batch in place (a ``batch`` event of rank 0)."""
        if self._row(name).state != "running":
            return  # stopping: the batch decided for its restart stays
        old, new, step = int(event["old"]), int(event["batch"]), int(event["step"])
        self._set_batch(name, step, old, new, "in_place")
        self.in_place_changes += 1
        self.say(f"job {name!r}: batch {old} -> {new} in place after step {step}")

    def _set_batch(self, name: str, step: int, old: int, new: int, how: str) -> None:
        """The job's batch is ``new`` from after ``step``: stored, and the change recorded
        (``how``: ``in_place``, ``restart`` or ``start``)."""
        self.store.update(name, batch=new)
        self.store.add_batch_change(name, step, old, new, how)

    def _end_run(self, name: str, state: str, **fields: object) -> None:
        g = self.groups.pop(name)
        g.release()
        self._heard.pop(name, None)
        self.store.update(name, state=state, placement=None, **fields)
        if state != "queued":
            self._next_batch.pop(name, None)
        self._next_decision = 0.0  # freed workers: decide again now

    def _row(self, name: str) -> JobRow:
        return self.store.job(name)

    def _cancel(self) -> None:
        for row in self.store.jobs(ACTIVE_STATES):
            if row.cancel:
                if row.name in self.groups:
                    self.groups.pop(row.name).release()
                self.store.update(row.name, state="cancelled", placement=None, ended=time.time())
                self.say(f"job {row.name!r} cancelled")

    # -------------------------------------------------------------- deciding
    def _capacity(self) -> tuple[np.ndarray, list[str | None]]:
        nodes = cluster_nodes()
        cap = np.array(
            [[n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0)] for n in nodes],
            dtype=np.float64,
        ).reshape(-1, 2)
        for name, g in self.groups.items():  # a stopping job holds its workers until it exits
            if self._row(name).state == "stopping":
                for node, w in zip(g.placement.nodes, g.placement.workers_per_node, strict=True):
                    if node < len(cap):
                        cap[node] -= w * np.asarray(g.spec.resources)
        return np.maximum(cap, 0.0), node_labels(nodes)

    def _schedule(self) -> None:
        rows = self.store.jobs(("queued", "running"))
        if not rows:
            return
        cap, labels = self._capacity()
        obs = [observe_record(rec) for rec in self.store.records(rows)]
        dec = self.decide(self.clock(), obs, cap, self.options.restart_delay_s)
        self.decisions += 1
        self.store.set_remaining(dec.remaining)
        for row in rows:
            new = dec.placements.get(row.name)
            batch = dec.batch_sizes.get(row.name)
            if batch is None and row.state == "queued" and row.name in self._next_batch:
                batch = self._next_batch[row.name][0]  # decided when it was stopped
            if batch is not None:  # the row as decided: its batch is the one to train with
                row = attrs.evolve(row, batch=int(batch))
            if row.state == "running":
                self._resize(row, new)
            elif new is not None and new.workers > 0:
                self._start(row, new, labels)

    def _resize(self, row: JobRow, new: JobPlacement | None) -> None:
        """Apply a decision to a running job: nothing, a batch change in place, or a
        checkpoint-restart (``row.batch``: the batch decided for it)."""
        g = self.groups[row.name]
        cur = g.placement
        same = new is not None and (new.nodes, new.workers_per_node) == (
            cur.nodes,
            cur.workers_per_node,
        )
        wanted = g.batch if g.pending_batch is None else g.pending_batch
        if same and row.batch == wanted:
            return
        if same and (row.spec.batch_change == "in_place" or not g.launched):
            if not g.launched:  # a group not started yet starts with it
                self._set_batch(row.name, g.first_step, g.batch, row.batch, "start")
            g.request_batch(row.batch)
            return
        if row.batch != g.batch:  # recorded when the next run starts (its resume step)
            self._next_batch[row.name] = (row.batch, "restart" if g.launched else "start")
        if not g.started:  # still starting: give its bundles back (killed, requeued)
            self._end_run(row.name, "queued")
            return
        g.request_stop()
        self.store.update(row.name, state="stopping", restarts=row.restarts + 1)
        self.reallocations += 1
        if new is not None:
            self._resized_at[row.name] = time.monotonic()
        after = "wait" if new is None else f"{new.workers} worker(s)"
        size = f"{cur.workers} worker(s)"
        batch = "" if row.batch == g.batch else f", batch {g.batch} -> {row.batch}"
        self.say(f"job {row.name!r}: re-allocated from {size} to {after}{batch}")

    def _start(self, row: JobRow, placement: JobPlacement, labels: list[str | None]) -> None:
        """Start a queued job on ``placement`` with ``row.batch`` (from its checkpoint)."""
        ckpt = self.store.latest_checkpoint(row.name)
        spec: JobSpec = row.spec
        options = ContextOptions(
            job_name=spec.name,
            rank=0,
            world_size=placement.workers,
            batch_size=row.batch,
            completion=spec.completion,
            checkpoint_every=spec.checkpoint_every,
            checkpoint_dir=str(Path(self.options.checkpoint_root) / spec.name),
            restore_path=None if ckpt is None else ckpt[1],
            args=spec.args,
            batch_change=spec.batch_change,
        )
        stored = self._row(row.name).batch
        how = self._next_batch.pop(row.name, (row.batch, "start"))[1]
        if stored != row.batch:
            self.store.add_batch_change(
                row.name, 0 if ckpt is None else ckpt[0], stored, row.batch, how
            )
        g = WorkerGroup(spec, placement, labels, options)
        g.first_step = 0 if ckpt is None else ckpt[0]
        self.groups[row.name] = g
        started = row.started if row.started is not None else time.time()
        self.store.update(
            row.name, state="running", placement=placement, started=started, batch=row.batch
        )
