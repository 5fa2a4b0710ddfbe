"""A job on Ray: one actor per worker in a placement group of the scheduler's size.

:class:`WorkerGroup` reserves a placement group with one bundle per worker (pinned to the
nodes the scheduler chose where the nodes can be told apart, see :func:`node_labels`),
starts a :class:`JobWorker` actor in each bundle, hands rank 0's address to the others
(torch.distributed, gloo on CPU) and polls their events. A dead actor or node makes the
group ``dead``; the service then restarts the job from its last checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import ray
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import ContextOptions, JobRunner, JobSpec
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dynsched_ray.runtime.ports import free_port

__all__ = ["JobWorker", "WorkerGroup", "cluster_nodes", "node_labels"]

#: seconds a poll, an address or a start may take before the group counts as dead
#: (judgement: far above a healthy actor's answer on a loaded 2-core machine)
CALL_TIMEOUT_S = 60.0
#: the custom resource prefix that names a node (benchmarks start nodes with it)
NODE_RESOURCE_PREFIX = "dynsched_node_"


class JobWorker:
    """One worker of a job (a threaded Ray actor wrapping a :class:`JobRunner`)."""

    def __init__(self) -> None:
        self._runner: JobRunner | None = None

    def address(self) -> tuple[str, int]:
        """This node's address and a free port (rank 0 hosts the job's group there)."""
        return ray.util.get_node_ip_address(), free_port()

    def start(
        self, options: ContextOptions, script: str, rendezvous: tuple[str, int] | None
    ) -> int:
        """Start the job script; returns this process's id."""
        import os

        self._runner = JobRunner(options, script, rendezvous)
        self._runner.start()
        return os.getpid()

    def poll(self) -> list[dict[str, Any]]:
        """Events since the last poll."""
        return [] if self._runner is None else self._runner.poll()

    def alive(self) -> bool:
        """Liveness check (events stay queued)."""
        return True

    def request_stop(self) -> None:
        """Ask the job to checkpoint and stop."""
        if self._runner is not None:
            self._runner.request_stop()

    def request_batch(self, batch: int) -> None:
        """Ask the job to train with global ``batch`` (``batch_change: in_place``)."""
        if self._runner is not None:
            self._runner.request_batch(batch)


_REMOTE_WORKER: Any = None


def _remote_worker() -> Any:
    global _REMOTE_WORKER
    if _REMOTE_WORKER is None:
        remote: Any = ray.remote  # Any: ray's stubs reject this call (call-overload)
        _REMOTE_WORKER = remote(max_concurrency=4, max_restarts=0)(JobWorker)
    return _REMOTE_WORKER


def cluster_nodes() -> list[dict[str, Any]]:
    """The alive Ray nodes, in a stable order (by node id), with their resources."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: str(n["NodeID"]))


def node_labels(nodes: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """A resource unique to each node, to pin bundles to it (None: nodes look alike).

    A node started with a ``dynsched_node_<k>`` resource is named by it; otherwise Ray's
    ``node:<ip>`` resource when every node has a different address.
    """
    labels: list[str | None] = []
    for n in nodes:
        own = sorted(k for k in n["Resources"] if k.startswith(NODE_RESOURCE_PREFIX))
        labels.append(own[0] if own else None)
    if all(labels) and len(set(labels)) == len(labels):
        return labels
    ips = [f"node:{n['NodeManagerAddress']}" for n in nodes]
    return list(ips) if len(set(ips)) == len(ips) else [None] * len(nodes)


def _bundles(
    spec: JobSpec, placement: JobPlacement, labels: Sequence[str | None]
) -> list[dict[str, float]]:
    cpu, gpu = spec.resources
    out = []
    for node, workers in zip(placement.nodes, placement.workers_per_node, strict=True):
        for _ in range(workers):
            b = {k: v for k, v in (("CPU", cpu), ("GPU", gpu)) if v > 0}
            label = labels[node] if node < len(labels) else None
            if label is not None:
                b[label] = 0.001
            out.append(b)
    return out


class WorkerGroup:
    """The actors of one run of a job (until it finishes, fails, or is re-allocated).

    Args:
        spec: the job.
        placement: where the scheduler put it.
        labels: :func:`node_labels` of the nodes the placement indexes.
        options: the context of rank 0 (the others differ by rank).
    """

    def __init__(
        self,
        spec: JobSpec,
        placement: JobPlacement,
        labels: Sequence[str | None],
        options: ContextOptions,
    ) -> None:
        self.spec = spec
        self.placement = placement
        self.options = options
        bundles = _bundles(spec, placement, labels)
        pinned = any(labels)
        strategy = "STRICT_PACK" if placement.num_servers == 1 and not pinned else "PACK"
        self.pg = placement_group(bundles, strategy=strategy)
        self._ready = self.pg.ready()
        self.actors: list[Any] = []
        self.started_at: float | None = None
        self.exits: dict[int, dict[str, Any]] = {}
        self.dead: str | None = None
        #: the step this run resumes from (its first report is start-up, not speed)
        self.first_step = 0
        #: the global batch the job trains with now (``batch`` events move it)
        self.batch = int(options.batch_size)
        #: the batch asked of the ranks and not yet switched to (None: none)
        self.pending_batch: int | None = None
        #: the worker processes' ids, by rank (known once started)
        self.pids: list[int] = []
        #: steady step times reported since the last throughput sample, by batch
        self.step_times: dict[int, list[float]] = {}
        self._address_ref: Any = None
        self._start_refs: list[Any] | None = None
        self._deadline = 0.0
        self._stop_asked = False

    @property
    def workers(self) -> int:
        """Workers of this run."""
        workers: int = self.placement.workers
        return workers

    @property
    def launched(self) -> bool:
        """Whether the ranks were handed the script (their options can no longer change)."""
        return self._start_refs is not None

    @property
    def started(self) -> bool:
        """Whether every rank's script runs."""
        return self.started_at is not None

    def _create_actors(self) -> None:
        cpu, gpu = self.spec.resources
        cls = _remote_worker()
        self.actors = [
            cls.options(
                num_cpus=cpu,
                num_gpus=gpu,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=i
                ),
            ).remote()
            for i in range(self.workers)
        ]
        self._address_ref = self.actors[0].address.remote() if self.workers > 1 else None
        self._deadline = time.monotonic() + CALL_TIMEOUT_S

    def _waiting(self, refs: list[Any], what: str) -> bool:
        """Whether ``refs`` are not all ready yet (past the deadline: the group is dead)."""
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if len(ready) == len(refs):
            return False
        if time.monotonic() > self._deadline:
            self.dead = f"GetTimeoutError: the workers' {what} took over {CALL_TIMEOUT_S:.0f} s"
        return True

    def _launch_step(self) -> bool:
        """Advance the start by what is ready, never waiting: bundles reserved, actors
        created, rank 0's address known, every rank's script started. Returns whether the
        group runs. A poll of the service never blocks on a starting job."""
        if self.started_at is not None:
            return True
        if not self.actors:
            if not ray.wait([self._ready], timeout=0)[0]:
                return False
            self._create_actors()
        if self._start_refs is None:
            rdv = None
            if self._address_ref is not None:
                if self._waiting([self._address_ref], "start-up"):
                    return False
                rdv = ray.get(self._address_ref, timeout=CALL_TIMEOUT_S)
            self._start_refs = [
                actor.start.remote(
                    ContextOptions(**{**_fields(self.options), "rank": rank}), self.spec.script, rdv
                )
                for rank, actor in enumerate(self.actors)
            ]
            self._deadline = time.monotonic() + CALL_TIMEOUT_S
        if self._waiting(self._start_refs, "script start"):
            return False
        self.pids = [int(p) for p in ray.get(self._start_refs, timeout=CALL_TIMEOUT_S)]
        self.started_at = time.monotonic()
        if self.pending_batch is not None:  # asked while the ranks were starting
            for a in self.actors:
                a.request_batch.remote(self.pending_batch)
        if self._stop_asked:
            for a in self.actors:
                a.request_stop.remote()
        return True

    def poll(self) -> list[dict[str, Any]]:
        """Advance the start (never blocking); the events since the last poll.

        A dead actor (or one that does not answer) sets :attr:`dead`.
        """
        if self.dead is not None:
            return []
        try:
            if not self._launch_step():
                return []
            batches = ray.get([a.poll.remote() for a in self.actors], timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            self.dead = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return []
        events = [e for batch in batches for e in batch]
        for e in events:
            if e["kind"] == "exit":
                self.exits[int(e["rank"])] = e
            elif e["kind"] == "batch":
                self.batch = int(e["batch"])
                if self.pending_batch == self.batch:
                    self.pending_batch = None
        if self.error is not None and not self.done:
            self._check_alive()  # a rank's error may be its peer's death
        return events

    def _check_alive(self) -> None:
        """Set :attr:`dead` when an actor of the group is gone."""
        for a in self.actors:
            try:
                ray.get(a.alive.remote(), timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                self.dead = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                return

    @property
    def done(self) -> bool:
        """Every rank's script returned."""
        return bool(self.actors) and len(self.exits) == len(self.actors)

    @property
    def error(self) -> str | None:
        """The first error a rank's script ended with, or None."""
        for rank in sorted(self.exits):
            if "error" in self.exits[rank]:
                return str(self.exits[rank]["error"])
        return None

    def request_stop(self) -> None:
        """Ask every rank to checkpoint and stop (a re-allocation); ranks still starting
        are asked once they run."""
        self._stop_asked = True
        if self.started_at is not None:
            for a in self.actors:
                a.request_stop.remote()

    def request_batch(self, batch: int) -> None:
        """Ask every rank to train with global ``batch`` from a step they agree on (a job
        with ``batch_change: in_place``); a group not yet launched starts with it."""
        if self._start_refs is None:
            self.options = attrs.evolve(self.options, batch_size=int(batch))
            self.batch = int(batch)
            return
        self.pending_batch = int(batch)
        if self.started_at is not None:  # else: asked once the ranks run
            for a in self.actors:
                a.request_batch.remote(int(batch))

    def release(self) -> None:
        """Kill the actors and free the placement group."""
        for a in self.actors:
            ray.kill(a, no_restart=True)
        remove_placement_group(self.pg)


def _fields(options: ContextOptions) -> dict[str, Any]:
    return attrs.asdict(options, recurse=False)
