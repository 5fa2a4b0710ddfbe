"""Real trainers on Ray: worker actors on the trainer pool's bundles, one data-parallel group.

- `TrainerActor` hosts any core `Trainer` (`TorchTrainer`, `MegatronTrainer`, ...) built
  inside the actor by a factory; with more than one worker it first joins a
  ``torch.distributed`` group (gloo on CPU, NCCL on GPU) so the workers form one
  data-parallel trainer.
- `RayTrainerGroup` starts one `TrainerActor` per trainer GPU, on bundle ``rank`` of the
  trainer pool, the bundle where the hybrid replicas of that GPU also sit, and owns the
  GPU side of the hand-over: it records every offload and reload in a core
  `GpuHandOver`, so a hybrid replica wrapped in `HandOverReplica` cannot wake on a GPU
  whose worker has not offloaded, and a worker cannot reload while a hybrid replica on
  its GPU is awake (`HandOverError`). A hybrid replica's GPUs come from its record in the
  run's `ReplicaSet` (`ReplicaPlacement.gpu_ids`); the group `follow`s the set, so the
  hand-over forgets a hybrid replica the moment the set marks it dead.
- `RayTrainerGroupBackend` is the core loop's ``TrainerBackend`` over a group: it
  reloads the workers (through the hand-over record), trains, exports the weights in
  Hugging Face names as safetensors bytes, and loads them into the standalone replicas.

torch is imported inside the actors only; the driver needs none of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import ray
from dynsched_core import ReplicaSet
from dynsched_core.errors import HandOverError
from dynsched_core.rollout import ReplicaPlacement
from dynsched_core.trainer import (
    GpuHandOver,
    HandOverReplica,
    MemoryReport,
    OffloadReport,
    TrainBatch,
    TrainMetrics,
)

from dynsched_ray.runtime.actors import placement_info, remote_class
from dynsched_ray.runtime.errors import TrainerOffloadedError
from dynsched_ray.runtime.placement import ResourcePools
from dynsched_ray.runtime.ports import free_port
from dynsched_ray.runtime.remote import await_ref
from dynsched_ray.trainers.elastic import (
    TrainerResizeError,
    broadcast_state,
    join_process_group,
    leave_process_group,
    needs_rebuild,
)
from dynsched_ray.trainers.standin import push_weights

__all__ = [
    "RayTrainerGroup",
    "RayTrainerGroupBackend",
    "RayTrainerSpec",
    "TrainerActor",
]

logger = logging.getLogger(__name__)


class TrainerActor:
    """Hosts one `Trainer`, built inside the actor by ``factory(*args, **kwargs)``.

    A plain (threaded-off) Ray actor: its calls run one at a time, so a training step,
    an offload and an export never overlap on one worker.

    Args:
        factory: Builds the trainer (a class such as `TorchTrainer`, or a picklable
            callable).
        args: Positional arguments of ``factory``.
        kwargs: Keyword arguments of ``factory``.
        rank: Data-parallel rank.
        world_size: Data-parallel size; > 1 makes `setup` join a process group first.
        collective_timeout_s: Bound of one collective (gradient all-reduce) of the group.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        rank: int = 0,
        world_size: int = 1,
        collective_timeout_s: float = 600.0,
    ) -> None:
        self._factory = factory
        self.collective_timeout_s = float(collective_timeout_s)
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self.rank = int(rank)
        self.world_size = int(world_size)
        self._trainer: Any = None
        self._synced: tuple[int, bytes] | None = None
        self._handoff: dict[str, Any] | None = None
        self._rebuilt = False

    def rendezvous_address(self) -> tuple[str, int]:
        """An address and a free port of this node, for rank 0 to host the group."""
        return ray.util.get_node_ip_address(), free_port()

    def setup(self, address: tuple[str, int] | None = None) -> dict[str, Any]:
        """Join the data-parallel group (when ``world_size > 1``), then build the trainer.

        Returns:
            `describe`'s answer.
        """
        if self._trainer is None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                join_process_group(self.rank, self.world_size, address, self.collective_timeout_s)
            self._trainer = self._factory(*self._args, **self._kwargs)
        return self.describe()

    # ------------------------------------------------------------------ elastic resize
    def snapshot(self, keep: bool) -> int:
        """Take the trainer's checkpoint before a resize (a collective for a sharded
        trainer: every old rank calls it); ``keep`` (rank 0) holds it for `receive_state`.

        Returns:
            Tensors held (0 when not kept).
        """
        state: dict[str, Any] = self._t().state_dict()
        self._handoff = state if keep else None
        return len(state.get("model", {})) if keep else 0

    def leave(self) -> None:
        """Leave the data-parallel group (the first step of a resize)."""
        leave_process_group(self._trainer)

    def rejoin(self, rank: int, world_size: int, address: tuple[str, int] | None) -> dict[str, Any]:
        """Join the re-formed group as ``rank`` of ``world_size``; a trainer bound to its old
        group (`needs_rebuild`) is built again (it gets its state in `receive_state`).

        Returns:
            `describe`'s answer.
        """
        join_process_group(rank, world_size, address, self.collective_timeout_s)
        self.rank, self.world_size = int(rank), int(world_size)
        self._rebuilt = needs_rebuild(self._trainer)
        if self._rebuilt:
            self._trainer = None
            self._trainer = self._factory(*self._args, **self._kwargs)
        return self.describe()

    def receive_state(self) -> int:
        """Rank 0's snapshot on every rank of the new group (a collective); loaded where the
        trainer does not hold it already (rank 0 keeps its own unless it was rebuilt).

        Returns:
            The trainer's version after it.
        """
        state = broadcast_state(self._handoff if self.rank == 0 else None)
        self._handoff = None
        if self.rank != 0 or self._rebuilt:
            self._t().load_state_dict(state)
        self._rebuilt = False
        return int(self._t().version)

    def _t(self) -> Any:
        if self._trainer is None:
            raise RuntimeError("TrainerActor.setup() has not run")
        return self._trainer

    def describe(self) -> dict[str, Any]:
        """Rank, placement, trainer class, version and memory of this worker."""
        t = self._trainer
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "placement": placement_info(),
            "trainer": type(t).__name__ if t is not None else None,
            "version": t.version if t is not None else None,
            "offloaded": t.is_offloaded if t is not None else None,
            "collective_export": bool(getattr(t, "collective_export", False)),
            "pid": os.getpid(),
        }

    def ping(self) -> bool:
        """Liveness check."""
        return True

    def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """One update on ``batch`` (this rank's share of it)."""
        metrics: TrainMetrics = self._t().train_step(batch)
        return metrics

    def offload(self) -> OffloadReport:
        """Offload the trainer (parameters, gradients, optimizer state)."""
        report: OffloadReport = self._t().offload()
        return report

    def reload(self) -> OffloadReport:
        """Reload the trainer."""
        report: OffloadReport = self._t().reload()
        return report

    def memory(self) -> MemoryReport:
        """Bytes the trainer holds."""
        report: MemoryReport = self._t().memory()
        return report

    def export_weights(self, as_bytes: bool = True, keep: bool = True) -> tuple[int, Any]:
        """``(version, weights)`` in Hugging Face names (safetensors bytes by default).

        ``keep=False`` (a rank that only takes part in a sharded trainer's gather) answers
        ``(version, None)``: the weights do not travel to the caller.
        """
        version, weights = self._t().export_weights(as_bytes=as_bytes)
        return int(version), weights if keep else None

    def keep_synced(self, version: int, return_bytes: bool = False) -> bytes | int:
        """Keep a host copy of the weights as synced as ``version`` (safetensors bytes).

        Called at every weight sync on every worker (all ranks hold the same weights):
        a hybrid replica on this worker's GPU that is lent later in the cycle loads this
        copy (`synced_weights`), while the trainer trains on; one copy is kept.

        Returns:
            The bytes when ``return_bytes`` (rank 0 feeds the standalone replicas), else
            their size.
        """
        _, data = self._t().export_weights(as_bytes=True)
        self._synced = (int(version), data)
        return data if return_bytes else len(data)

    def synced_weights(self, version: int) -> bytes:
        """The copy `keep_synced` kept for ``version``.

        Raises:
            LookupError: this worker keeps another version (or none).
        """
        if self._synced is None or self._synced[0] != version:
            kept = None if self._synced is None else self._synced[0]
            raise LookupError(f"trainer rank {self.rank} keeps weights v{kept}, not v{version}")
        return self._synced[1]

    def state_dict(self, keep: bool = True) -> dict[str, Any]:
        """The trainer's checkpoint (``keep=False``: built, for a sharded trainer's gather,
        but answered as ``{}``)."""
        state: dict[str, Any] = self._t().state_dict()
        return state if keep else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint."""
        self._t().load_state_dict(state)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call any other method of the hosted trainer."""
        return getattr(self._t(), method)(*args, **kwargs)


def _any_tuple(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class RayTrainerSpec:
    """What trainer the Ray runner starts on each trainer GPU, and how it is fed.

    Attributes:
        factory: Builds the trainer inside each worker actor (e.g. `TorchTrainer`).
        args: Positional arguments of ``factory`` (e.g. the model folder).
        kwargs: Keyword arguments of ``factory`` (e.g. ``{"options": TrainerOptions()}``).
        make_batch: ``make_batch(samples, version) -> TrainBatch``, in the driver
            (e.g. ``lambda s, v: TrainBatch.from_samples(s, reward_fn, version=v)``).
        workers: Worker actors (None: one per trainer GPU).
        gpu_fraction: Share of its bundle's GPU each worker declares (None: what the
            hybrid replicas leave).
        allow_unreleased_sleep: See `GpuHandOver` (True only where the GPUs are
            bookkeeping, e.g. CPU runs whose replicas cannot free memory).
        setup_timeout_s: Bound of the workers' start-up (model load, group join).
        step_timeout_s: Bound of one training step.
    """

    factory: Callable[..., Any]
    args: tuple[Any, ...] = attrs.field(default=(), converter=_any_tuple)
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    make_batch: Callable[[Sequence[Any], int], TrainBatch]
    workers: int | None = None
    gpu_fraction: float | None = None
    allow_unreleased_sleep: bool = False
    setup_timeout_s: float = 600.0
    step_timeout_s: float = 3600.0


class RayTrainerGroup:
    """Trainer worker actors on the trainer pool, one data-parallel trainer.

    Build with `launch`. Worker ``rank`` sits on trainer bundle ``rank`` (its GPU key in
    `handover`). Every method awaits its actor calls with a timeout.

    Attributes:
        workers: Actor handles, by rank.
        gpus: GPU key (trainer bundle index) of each worker.
        handover: The hand-over record shared with the hybrid replicas.
        collective: The trainer's ``collective_export`` (a sharded trainer: its export and
            checkpoint gather the shards, so `export_weights`, `state_dict` and
            `keep_synced` run on every rank and keep rank 0's answer; otherwise rank 0 alone
            answers them, all ranks holding the same weights).
        bundles: Trainer-pool bundles: the most workers `resize` may grow to.
    """

    def __init__(
        self,
        workers: Sequence[Any],
        gpus: Sequence[Hashable],
        handover: GpuHandOver,
        *,
        call_timeout_s: float = 600.0,
        step_timeout_s: float = 3600.0,
        collective: bool = False,
        spawn: Callable[[int, int, int], Any] | None = None,
        bundles: int | None = None,
    ) -> None:
        self.workers = list(workers)
        self._spawn = spawn
        self.bundles = len(self.workers) if bundles is None else int(bundles)
        #: True between a weight sync (`keep_synced`) or the launch and the next step:
        #: where `resize` may run.
        self.at_sync_boundary = True
        self.resizes = 0
        self.collective = bool(collective)
        self.gpus = list(gpus)
        self.handover = handover
        self.call_timeout_s = float(call_timeout_s)
        self.step_timeout_s = float(step_timeout_s)
        self._offloaded = dict.fromkeys(self.gpus, False)
        self.reports: list[tuple[Hashable, OffloadReport]] = []
        #: The version the workers that host hybrid replicas keep a synced copy of
        #: (`keep_synced`), or None.
        self.synced_version: int | None = None
        self._hybrid_gpus: set[Hashable] = set()
        self._kept_ranks: frozenset[int] = frozenset()

    @classmethod
    async def launch(
        cls,
        pools: ResourcePools,
        spec: RayTrainerSpec,
        *,
        handover: GpuHandOver | None = None,
        gpu_fraction: float = 1.0,
        name: str = "dynsched",
        namespace: str | None = None,
        call_timeout_s: float = 600.0,
    ) -> RayTrainerGroup:
        """Start one worker per trainer GPU (or ``spec.workers``) and build the trainers.

        Raises:
            RemoteCallTimeoutError: the workers did not come up within
                ``spec.setup_timeout_s``.
        """
        n = pools.trainer_gpus if spec.workers is None else spec.workers
        if not 1 <= n <= pools.trainer_gpus:
            raise ValueError(
                f"RayTrainerSpec.workers must be in [1, {pools.trainer_gpus}] (one per trainer "
                f"GPU at most), got {n}"
            )
        frac = spec.gpu_fraction if spec.gpu_fraction is not None else gpu_fraction
        handover = handover or GpuHandOver(allow_unreleased_sleep=spec.allow_unreleased_sleep)
        spawn = _spawner(pools, spec, frac, name, namespace)
        handles: list[Any] = []
        try:
            for rank in range(n):
                handles.append(spawn(rank, n, 0))
            address = None
            if n > 1:
                address = await await_ref(
                    handles[0].rendezvous_address.remote(),
                    timeout_s=spec.setup_timeout_s,
                    what="trainer.rendezvous_address",
                )
            described = await asyncio.gather(
                *(
                    await_ref(
                        h.setup.remote(address),
                        timeout_s=spec.setup_timeout_s,
                        what="trainer.setup",
                    )
                    for h in handles
                )
            )
        except BaseException:
            for h in handles:
                _kill(h)
            raise
        gpus = list(range(n))
        for g in gpus:
            handover.register_trainer(g, resident=True)
        logger.info("trainer group %s up: %d worker(s)", name, n)
        return cls(
            handles,
            gpus,
            handover,
            call_timeout_s=call_timeout_s,
            step_timeout_s=spec.step_timeout_s,
            collective=any(d.get("collective_export", False) for d in described),
            spawn=spawn,
            bundles=pools.trainer_gpus,
        )

    async def _all(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        return list(
            await asyncio.gather(
                *(
                    await_ref(
                        getattr(w, method).remote(*args),
                        timeout_s=timeout_s or self.call_timeout_s,
                        what=f"trainer.{method}",
                    )
                    for w in self.workers
                )
            )
        )

    async def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """One data-parallel update on every worker; returns rank 0's metrics.

        Raises:
            TrainerOffloadedError: a worker is offloaded (call `acquire` first).
        """
        offloaded = [g for g in self.gpus if self._offloaded[g]]
        if offloaded:
            # checked here: a rank that started alone would wait in its all-reduce forever
            raise TrainerOffloadedError(
                f"trainer worker(s) of GPU(s) {offloaded} are offloaded: call acquire() first"
            )
        self.at_sync_boundary = False
        metrics = await self._all("train_step", batch, timeout_s=self.step_timeout_s)
        out: TrainMetrics = metrics[0]
        slowest = max(m.compute_s for m in metrics)
        return attrs.evolve(out, compute_s=slowest)

    async def release(self, gpus: Sequence[Hashable] | None = None) -> list[OffloadReport]:
        """Offload the workers of ``gpus`` (default: all) and record it in `handover`."""
        targets = [g for g in (self.gpus if gpus is None else gpus) if g in self._offloaded]
        reports = await self._move([g for g in targets if not self._offloaded[g]], "offload")
        for g in targets:
            self.handover.trainer_offloaded(g)
        return reports

    async def acquire(self) -> list[OffloadReport]:
        """Reload every offloaded worker.

        Raises:
            HandOverError: a hybrid replica on one of the GPUs is still awake (nothing is
                reloaded then).
        """
        todo = [g for g in self.gpus if self._offloaded[g]]
        for g in todo:  # check every GPU before touching any
            holders = self.handover.holders(g)
            if holders.awake:
                self.handover.trainer_reloading(g)  # raises HandOverError
        for g in todo:
            self.handover.trainer_reloading(g)
        return await self._move(todo, "reload")

    async def _move(self, gpus: Sequence[Hashable], method: str) -> list[OffloadReport]:
        """``offload`` or ``reload`` the workers of ``gpus`` in parallel; record it."""
        reports = await asyncio.gather(
            *(
                await_ref(
                    getattr(self.workers[self.gpus.index(g)], method).remote(),
                    timeout_s=self.call_timeout_s,
                    what=f"trainer.{method}",
                )
                for g in gpus
            )
        )
        for g, rep in zip(gpus, reports, strict=True):
            self._offloaded[g] = method == "offload"
            self.reports.append((g, rep))
        return list(reports)

    # ------------------------------------------------------------------ elastic resize
    def check_resize(self, workers: int) -> None:
        """Refuse a resize that cannot run now (see `resize`)."""
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise TypeError(f"RayTrainerGroup.resize: workers must be an int, got {workers!r}")
        if not 1 <= workers <= self.bundles:
            raise ValueError(
                f"RayTrainerGroup.resize: workers must be in [1, {self.bundles}] (the trainer "
                f"pool's bundles), got {workers}"
            )
        if not self.at_sync_boundary:
            raise TrainerResizeError(
                "RayTrainerGroup.resize runs at a sync boundary only: a train step ran (or "
                "runs) since the last weight sync; resize after sync_weights/keep_synced"
            )
        offloaded = [g for g in self.gpus if self._offloaded[g]]
        if offloaded:
            raise TrainerOffloadedError(
                f"RayTrainerGroup.resize: trainer worker(s) of GPU(s) {offloaded} are offloaded:"
                " call acquire() first"
            )
        if workers > len(self.workers) and self._spawn is None:
            raise TrainerResizeError(
                "RayTrainerGroup.resize: this group cannot start workers (build it with launch)"
            )
        for g in range(len(self.workers), workers):
            awake = self.handover.holders(g).awake
            if awake:
                raise HandOverError(
                    f"RayTrainerGroup.resize: hybrid replica(s) {list(awake)} are awake on GPU "
                    f"{g!r}; a trainer worker cannot start there (sleep them first)",
                    g,
                    awake,
                )

    async def _each(self, calls: Sequence[tuple[Any, str, tuple[Any, ...]]]) -> list[Any]:
        """``handle.method.remote(*args)`` of every ``(handle, method, args)``, in parallel."""
        return list(
            await asyncio.gather(
                *(
                    await_ref(
                        getattr(h, m).remote(*a),
                        timeout_s=self.call_timeout_s,
                        what=f"trainer.{m}",
                    )
                    for h, m, a in calls
                )
            )
        )

    async def resize(self, workers: int) -> float:
        """Grow or shrink the data-parallel group to ``workers`` at a sync boundary.

        Rank 0 snapshots the trainer (every old rank takes part for a `collective` one);
        every worker leaves the process group; the workers of ranks ``>= workers`` stop;
        new workers start on trainer bundles ``len(workers) ..`` (their GPU keys registered
        resident in `handover`); the group re-forms with the new world size and rank 0's
        model and optimizer state is broadcast to every rank (sharded state re-sharded).
        The next `train_step` splits the same global batch over the new ranks (see
        `dynsched_ray.trainers.elastic`). The GPUs of stopped workers are marked
        offloaded in `handover` (free for whoever comes next). If it fails half-way the
        group is broken: shut it down.

        Returns:
            Seconds it took (0 when the size does not change).

        Raises:
            ValueError: ``workers`` outside ``[1, bundles]``.
            TrainerResizeError: not at a sync boundary (a step ran since the last
                `keep_synced`), or the group cannot start workers.
            TrainerOffloadedError: a worker is offloaded (call `acquire` first).
            HandOverError: a hybrid replica is awake on a GPU a new worker needs.
        """
        self.check_resize(workers)
        old = len(self.workers)
        if workers == old:
            return 0.0
        t0 = time.perf_counter()
        self.at_sync_boundary = False
        self.resizes += 1
        await self._each([(self.workers[r], "snapshot", (r == 0,)) for r in self._answering()])
        await self._each([(w, "leave", ()) for w in self.workers])
        for w in self.workers[workers:]:
            _kill(w)
        kept = self.workers[:workers]
        spawn = self._spawn
        spawned = (
            [] if spawn is None else [spawn(r, workers, self.resizes) for r in range(old, workers)]
        )
        try:
            address = None
            if workers > 1:
                address = (await self._each([(kept[0], "rendezvous_address", ())]))[0]
            await self._each(
                [(w, "rejoin", (r, workers, address)) for r, w in enumerate(kept)]
                + [(w, "setup", (address,)) for w in spawned]
            )
            self.workers = kept + spawned
            await self._each([(w, "receive_state", ()) for w in self.workers])
        except BaseException:
            for w in spawned:
                _kill(w)
            raise
        self._regpus(workers)
        self.at_sync_boundary = True
        seconds = time.perf_counter() - t0
        logger.info("trainer group resized %d -> %d worker(s) in %.3f s", old, workers, seconds)
        return seconds

    def _regpus(self, workers: int) -> None:
        """GPU keys, hand-over and kept-copy records after a resize to ``workers``."""
        for g in self.gpus[workers:]:
            self.handover.trainer_offloaded(g)
        new = list(range(len(self.gpus), workers))
        for g in new:
            self.handover.register_trainer(g, resident=True)
        self.gpus = list(range(workers))
        self._offloaded = dict.fromkeys(self.gpus, False)
        self._kept_ranks = frozenset(r for r in self._kept_ranks if r < workers)

    def is_offloaded(self, gpu: Hashable) -> bool:
        """Whether the worker of ``gpu`` is offloaded."""
        return self._offloaded[gpu]

    def _answering(self, ranks: Sequence[int] = (0,)) -> list[int]:
        """The ranks a rank-0 question goes to: ``ranks``, or every rank when `collective`
        (all of them must enter the gather)."""
        return list(range(len(self.workers))) if self.collective else sorted(ranks)

    async def _rank0(self, method: str, *args: Any) -> Any:
        """Rank 0's answer to ``method(*args, keep)``, asked of the `_answering` ranks
        (``keep`` is True for rank 0 alone, so only its answer travels)."""
        outs = await asyncio.gather(
            *(
                await_ref(
                    getattr(self.workers[rank], method).remote(*args, rank == 0),
                    timeout_s=self.call_timeout_s,
                    what=f"trainer.{method}",
                )
                for rank in self._answering()
            )
        )
        return outs[0]

    async def export_weights(self, as_bytes: bool = True) -> tuple[int, Any]:
        """Rank 0's ``(version, weights)`` (all ranks hold the same weights)."""
        out: tuple[int, Any] = await self._rank0("export_weights", as_bytes)
        return out

    async def keep_synced(self, version: int) -> bytes:
        """Rank 0 and every worker whose GPU hosts a hybrid replica keep a host copy of
        ``version`` (`TrainerActor.keep_synced`), in parallel; returns rank 0's bytes (for
        the standalone replicas). Workers without a hybrid replica export nothing, unless
        the trainer is `collective` (then every rank gathers and keeps a copy)."""
        self.synced_version = None
        ranks = self._answering(
            list({0} | {self.gpus.index(g) for g in self._hybrid_gpus if g in self.gpus})
        )
        outs = await asyncio.gather(
            *(
                await_ref(
                    self.workers[rank].keep_synced.remote(version, rank == 0),
                    timeout_s=self.call_timeout_s,
                    what="trainer.keep_synced",
                )
                for rank in ranks
            )
        )
        self._kept_ranks = frozenset(ranks)
        self.synced_version = version
        self.at_sync_boundary = True
        data: bytes = outs[0]
        return data

    def local_weights(self, gpus: Sequence[Hashable], version: int) -> Any:
        """An object ref of the synced copy of ``version`` kept by the worker on ``gpus``.

        A hybrid replica sitting on those GPUs loads it from its own node's object store
        (a local copy; the driver never handles the bytes). None when no worker there
        keeps that version (e.g. right after a resume, before the first sync).
        """
        if self.synced_version != version:
            return None
        for g in gpus:
            if g in self.gpus and self.gpus.index(g) in self._kept_ranks:
                return self.workers[self.gpus.index(g)].synced_weights.remote(version)
        return None

    async def memory(self) -> list[MemoryReport]:
        """Each worker's memory."""
        return await self._all("memory")

    async def describe(self) -> list[dict[str, Any]]:
        """Each worker's `TrainerActor.describe`."""
        return await self._all("describe")

    async def state_dict(self) -> dict[str, Any]:
        """Rank 0's checkpoint."""
        out: dict[str, Any] = await self._rank0("state_dict")
        return out

    async def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load one checkpoint into every worker."""
        await self._all("load_state_dict", state)

    def hybrid(
        self,
        replica: Any,
        gpus: Sequence[Hashable] | ReplicaPlacement,
        *,
        awake: bool = False,
    ) -> HandOverReplica:
        """Wrap a hybrid replica on ``gpus`` (its `ReplicaPlacement` record, or the GPU
        keys): its ``wake_up`` first offloads those workers (and from the next sync on they
        keep a synced copy of the weights for it)."""
        keys = tuple(gpus.gpu_ids if isinstance(gpus, ReplicaPlacement) else gpus)
        self._hybrid_gpus.update(keys)
        return HandOverReplica(
            replica,
            self.handover,
            keys,
            before_wake=lambda: self.release(keys),
            awake=awake,
        )

    def follow(self, replicas: ReplicaSet) -> Callable[[], None]:
        """Learn hybrid deaths from the run's `ReplicaSet`: the hand-over forgets each
        hybrid replica the set reports dead or removed (`GpuHandOver.follow`)."""
        return self.handover.follow(replicas)

    def shutdown(self) -> None:
        """Kill the worker actors."""
        for w in self.workers:
            _kill(w)


class RayTrainerGroupBackend:
    """The core loop's ``TrainerBackend`` over a `RayTrainerGroup`.

    Args:
        group: The trainer workers.
        make_batch: ``make_batch(samples, version) -> TrainBatch``.
        replicas: The run's `ReplicaSet` (its live standalone members get the weights),
            or a mapping of standalone replicas.
        on_step: Called with the samples of every step.

    Attributes:
        metrics: `TrainMetrics` of every step.
        version: The last synced version.
    """

    def __init__(
        self,
        group: RayTrainerGroup,
        make_batch: Callable[[Sequence[Any], int], TrainBatch],
        replicas: Any,
        *,
        on_step: Callable[[Sequence[Any]], None] | None = None,
    ) -> None:
        self.group = group
        self.make_batch = make_batch
        self.replicas = replicas
        self._on_step = on_step
        self.metrics: list[TrainMetrics] = []
        self.version = 0

    async def train_step(self, samples: Sequence[Any]) -> Mapping[str, float]:
        """Reload the workers (hand-over checked), train; return ``update_actor`` seconds."""
        if self._on_step is not None:
            self._on_step(samples)
        batch = self.make_batch(samples, self.version)
        reloaded = await self.group.acquire()
        metrics = await self.group.train_step(batch)
        self.metrics.append(metrics)
        out = {"update_actor": metrics.compute_s}
        if reloaded:
            out["trainer_reload"] = max(r.seconds for r in reloaded)
        return out

    async def sync_weights(self, version: int) -> Any:
        """Every worker keeps the synced copy; rank 0's safetensors bytes go to the live
        standalone replicas (and back to the loop, for the driver)."""
        self.version = version
        weights = await self.group.keep_synced(version)
        replicas = [r for r in standalone_of(self.replicas) if not getattr(r, "is_dead", False)]
        await push_weights(replicas, version, weights)
        return weights


def _spawner(
    pools: ResourcePools, spec: RayTrainerSpec, frac: float, name: str, namespace: str | None
) -> Callable[[int, int, int], Any]:
    """``spawn(rank, world_size, generation)``: a `TrainerActor` (not set up yet) on trainer
    bundle ``rank``, declaring ``frac`` of its GPU; named ``<name>-trainer-<rank>`` (with
    ``-r<generation>`` when a resize starts it, so a name a stopped worker held is not
    reused)."""

    def spawn(rank: int, world_size: int, generation: int) -> Any:
        suffix = f"-r{generation}" if generation else ""
        opts: dict[str, Any] = {
            "num_cpus": 0,
            "scheduling_strategy": pools.trainer_strategy(rank),
            "name": f"{name}-trainer-{rank}{suffix}",
            "namespace": namespace,
        }
        if frac > 0:
            opts["num_gpus"] = frac
        return (
            remote_class(TrainerActor)
            .options(**opts)
            .remote(
                spec.factory, spec.args, dict(spec.kwargs), rank, world_size, spec.step_timeout_s
            )
        )

    return spawn


def standalone_of(replicas: Any) -> list[Any]:
    """The live standalone members of a `ReplicaSet`, or the values of a mapping."""
    of_role = getattr(replicas, "of_role", None)
    if of_role is not None:
        return list(of_role("standalone"))
    return list(replicas.values())


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        logger.debug("trainer actor already gone", exc_info=True)
