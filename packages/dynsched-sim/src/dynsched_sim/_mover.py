"""`SimRoleMover`: the simulator's host of the role planner (`dynsched_core.planner`).

A move happens at a sync boundary (the trainer idle, every hybrid replica asleep):

- ``to_trainer``: the last ``k`` standalone replicas leave routing, their requests are
  aborted (the client resumes them elsewhere, re-prefilling what they had decoded, as
  after a hybrid deactivation) and they are retired; their GPUs join the trainer, whose
  optimizer state is re-sharded over the larger group (`ResizeCosts.reshard_s`); with
  hybrid lending a hybrid replica (asleep) is added on each new replica's GPUs.
- ``to_rollout``: the trainer re-shards onto fewer GPUs, the hybrid replicas on the
  freed GPUs are removed, and ``k`` standalone replicas start there (engine start and
  a weight load, `ResizeCosts.start_s`), get the current weights and join routing.

The trainer is blocked for the whole move (the loop awaits it); the other replicas keep
generating. Accounting: GPU groups keep their names (a retired standalone group then
counts trainer time, a former trainer group rollout time), so the ``cluster`` fractions
stay exact while the per-pool ones describe the pools of the initial split.
"""

from __future__ import annotations

import asyncio

import attrs
from dynsched_core import FullyAsyncLoop, ReplicaSet
from dynsched_core import validators as v
from dynsched_core.planner import RoleMove, RoleSplit

from dynsched_sim._cluster import SimCluster
from dynsched_sim._models import HardwareModel, LLMModel
from dynsched_sim._replica import SimReplica

__all__ = ["ResizeCosts", "SimRoleMover"]

_GIB = float(2**30)


@attrs.frozen(kw_only=True)
class ResizeCosts:
    """What a role move costs in the simulator.

    Attributes:
        reinit_s: Fixed latency of a trainer resize: the data-parallel process group torn
            down and re-created (NCCL communicators rebuilt, a barrier) and the optimizer
            re-initialised around the re-sharded state. Judgement: 30 s, tens of seconds
            for a torch.distributed re-initialisation across nodes.
        engine_start_s: Start of one inference engine on freed GPUs besides its weight
            load (process start, KV-cache allocation, CUDA-graph capture). Judgement:
            60 s, the order of a vLLM engine start of a tens-of-billions model.
    """

    reinit_s: float = attrs.field(default=30.0, validator=v.float_ge(0.0))
    engine_start_s: float = attrs.field(default=60.0, validator=v.float_ge(0.0))

    def reshard_s(self, hw: HardwareModel, llm: LLMModel) -> float:
        """Trainer resize: the trainer state (weights + gradients + optimizer state) crosses
        the network once, ``(trainer_state_bytes + weight_bytes) / network_bandwidth``
        (public configuration: the scenario's labelled ``hardware.network_bandwidth_gib_s``;
        judgement: a re-shard between different data-parallel sizes moves almost every
        shard), plus `reinit_s`."""
        state = llm.trainer_state_bytes + llm.weight_bytes
        return state / (hw.network_bandwidth_gib_s * _GIB) + self.reinit_s

    def start_s(self, hw: HardwareModel, llm: LLMModel) -> float:
        """One new standalone engine: `engine_start_s` plus loading the current weights
        over the network, as a weight sync does (``weight_bytes / network_bandwidth +
        network_latency_s``, `EngineModel.broadcast_sync_s`; paid by the replica's own
        ``update_weights`` in `SimRoleMover`)."""
        return (
            self.engine_start_s
            + llm.weight_bytes / (hw.network_bandwidth_gib_s * _GIB)
            + hw.network_latency_s
        )


class SimRoleMover:
    """Moves GPUs between the simulated trainer and standalone pool (module docstring).

    Args:
        cluster: The run's cluster (its trainer must have one accounting group per
            replica's GPUs: trainer GPUs a multiple of ``gpus_per_replica``).
        costs: What a move costs.

    `bind` it to the run's loop (its `ReplicaSet`) before the first move.

    Raises:
        ValueError: the trainer GPUs are not whole replicas.
    """

    def __init__(self, cluster: SimCluster, costs: ResizeCosts | None = None) -> None:
        g = cluster.scenario.engine.gpus_per_replica
        if cluster.trainer.gpus % g:
            raise ValueError(
                f"SimRoleMover: trainer GPUs ({cluster.trainer.gpus}) must be a multiple of "
                f"engine.gpus_per_replica ({g})"
            )
        self._cluster = cluster
        self._floop: FullyAsyncLoop | None = None
        self.costs = costs if costs is not None else ResizeCosts()
        self._g = g
        self._next = len(cluster.standalone) + len(cluster.hybrid)
        # accounting group of each replica (build_cluster: a standalone replica's is its
        # id, hybrid replica i's the trainer group i)
        self._group_of = {r.replica_id: r.replica_id for r in cluster.standalone}
        self._group_of.update(
            (r.replica_id, grp)
            for r, grp in zip(cluster.hybrid, cluster.trainer.groups, strict=False)
        )
        self.moves = 0
        self.seconds = 0.0

    def bind(self, floop: FullyAsyncLoop) -> None:
        """The loop whose replicas the moves change."""
        self._floop = floop

    @property
    def _replicas(self) -> ReplicaSet:
        if self._floop is None:
            raise RuntimeError("SimRoleMover.bind(loop) must be called before a move")
        return self._floop.replicas

    def split(self) -> RoleSplit:
        """The current split."""
        t = self._cluster.trainer
        return RoleSplit(
            trainer_gpus=t.gpus,
            standalone_replicas=len(t.standalone),
            gpus_per_replica=self._g,
        )

    def estimate_s(self, move: RoleMove) -> float:
        """What ``move`` will cost the trainer, seconds (`ResizeCosts`)."""
        hw, llm = self._cluster.scenario.hardware, self._cluster.scenario.model
        cost = self.costs.reshard_s(hw, llm)
        if move.direction == "to_rollout":
            cost += self.costs.start_s(hw, llm)
        return cost

    async def move(self, move: RoleMove) -> float:
        """Apply ``move`` at this sync boundary; the simulated seconds it took.

        Raises:
            ValueError: ``move.before`` is not the current split.
        """
        if move.before != self.split():
            raise ValueError(f"SimRoleMover.move: before={move.before}, current {self.split()}")
        loop = asyncio.get_running_loop()
        start = loop.time()
        if move.direction == "to_trainer":
            await self._to_trainer(move.replicas)
        else:
            await self._to_rollout(move.replicas)
        took = loop.time() - start
        self.moves += 1
        self.seconds += took
        return took

    def _new(self, role: str, node: str, group: str) -> SimReplica:
        """A fresh replica (a new id) on the GPUs of accounting group ``group``."""
        replica = self._cluster.make_replica(role, self._next, node, group)
        self._next += 1
        self._group_of[replica.replica_id] = group
        return replica

    async def _to_trainer(self, k: int) -> None:
        c, t = self._cluster, self._cluster.trainer
        leaving = t.standalone[-k:]
        ids = [r.replica_id for r in leaving]
        replicas = self._replicas
        await replicas.unroute(ids)
        for r in leaving:
            await r.abort(None)  # the client resumes them on the routable replicas
        for rid in ids:
            await replicas.remove(rid)
        c.retired.extend(leaving)
        groups = [self._group_of[rid] for rid in ids]
        hybrid = t.hybrid
        if c.conf.hybrid:
            for grp in groups:
                new = self._new("hybrid", "trainer", grp)
                replicas.add(new, "hybrid")
                hybrid.append(new)
        self._set_trainer(t.gpus + k * self._g, t.groups + groups, t.standalone[:-k], hybrid)
        await asyncio.sleep(self.costs.reshard_s(c.scenario.hardware, c.scenario.model))

    async def _to_rollout(self, k: int) -> None:
        c, t = self._cluster, self._cluster.trainer
        hw, llm = c.scenario.hardware, c.scenario.model
        groups = t.groups[-k:]
        replicas = self._replicas
        on_freed = [r for r in t.hybrid if self._group_of[r.replica_id] in groups]
        for r in on_freed:
            await r.sleep()  # asleep already at a sync boundary (a no-op then)
            await replicas.remove(r.replica_id)
        c.retired.extend(on_freed)
        hybrid = [r for r in t.hybrid if r not in on_freed]
        self._set_trainer(t.gpus - k * self._g, t.groups[:-k], t.standalone, hybrid)
        await asyncio.sleep(self.costs.reshard_s(hw, llm) + self.costs.engine_start_s)
        new = [self._new("standalone", "rollout", grp) for grp in groups]
        version = t.version  # the version just synced (the driver records it after)
        # the weight load: the current weights over the network, as a sync (its cost)
        await asyncio.gather(*(r.update_weights(version) for r in new))
        for r in new:
            replicas.add(r, "standalone")
        await replicas.route([r.replica_id for r in new])
        t.regroup(t.gpus, groups=t.groups, standalone=t.standalone + new, hybrid=t.hybrid)

    def _set_trainer(
        self, gpus: int, groups: list[str], standalone: list[SimReplica], hybrid: list[SimReplica]
    ) -> None:
        self._cluster.trainer.regroup(gpus, groups=groups, standalone=standalone, hybrid=hybrid)
        self._cluster.standalone = list(standalone)
        self._cluster.hybrid = list(hybrid)
