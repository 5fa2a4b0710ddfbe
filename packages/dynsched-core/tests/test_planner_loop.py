"""The role planner in the reference loop, with an in-memory host that really moves
`InMemoryReplica`s between the roles (on a virtual-time event loop)."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from dynsched_core import (
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    FullyAsyncLoop,
    InMemoryReplica,
    ReplicaSet,
)
from dynsched_core.events import RoleMoveEvent
from dynsched_core.planner import RoleMove, RoleMover, RolePlanner, RolePlannerOptions, RoleSplit


class _JumpSelector:
    """'Waiting' moves the clock to the next timer (nothing here does I/O)."""

    def __init__(self, loop: _JumpLoop, inner: selectors.BaseSelector) -> None:
        self._loop, self._inner = loop, inner

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("deadlock: nothing ready and no timer")
        self._loop.now_s += max(timeout, 0.0)
        return self._inner.select(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _JumpLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self.now_s = 0.0
        self._selector = _JumpSelector(self, self._selector)  # type: ignore[has-type]

    def time(self) -> float:
        return self.now_s


class Never(DynamicSchedulePolicyBase):
    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return False

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return False


class ElasticTrainer:
    """A data-parallel trainer whose step takes ``fixed_s + work_s / gpus`` on the clock."""

    def __init__(self, gpus: int, *, fixed_s: float = 1.0, work_s: float = 400.0) -> None:
        self.gpus = gpus
        self.fixed_s, self.work_s = fixed_s, work_s
        self.steps_on: list[int] = []

    async def train_step(self, samples: Sequence[Any]) -> Mapping[str, float]:
        seconds = self.fixed_s + self.work_s / self.gpus
        self.steps_on.append(self.gpus)
        await asyncio.sleep(seconds)
        return {"update_actor": seconds}

    async def sync_weights(self, version: int) -> None:
        self.version = version


class InMemoryRoleMover:
    """Moves `InMemoryReplica`s between the roles: retiring one (unrouted, its requests
    aborted and resumed elsewhere by the client, removed) grows the trainer by its GPUs;
    shrinking the trainer starts a fresh replica with the current weights."""

    def __init__(
        self, replicas: ReplicaSet, trainer: ElasticTrainer, *, gpus_per_replica: int = 1
    ) -> None:
        self.replicas, self.trainer, self.g = replicas, trainer, gpus_per_replica
        self.started = 0
        self.retired: list[str] = []
        self.cost_s = 5.0

    def split(self) -> RoleSplit:
        return RoleSplit(
            trainer_gpus=self.trainer.gpus,
            standalone_replicas=self.replicas.num_standalone,
            gpus_per_replica=self.g,
        )

    async def move(self, move: RoleMove) -> float:
        assert move.before == self.split()
        start = asyncio.get_running_loop().time()
        if move.direction == "to_trainer":
            ids = self.replicas.standalone_ids[-move.replicas :]
            await self.replicas.unroute(ids)
            for rid in ids:
                await self.replicas[rid].abort(None)
                await self.replicas.remove(rid)
            self.retired += ids
            self.trainer.gpus += move.gpus
        else:
            self.trainer.gpus -= move.gpus
            for _ in range(move.replicas):
                self.started += 1
                r = InMemoryReplica(f"new-{self.started}", tokens_per_s=50.0, num_gpus=self.g)
                await r.update_weights(getattr(self.trainer, "version", 0))
                self.replicas.add(r, "standalone")
                await self.replicas.route([r.replica_id])
        await asyncio.sleep(self.cost_s)
        return asyncio.get_running_loop().time() - start


class ScriptedPlanner(RolePlanner):
    """Proposes the moves of a script, one per decision (None: no move)."""

    def __init__(self, script: list[str | None], config: Any) -> None:
        super().__init__(RolePlannerOptions(every_n_syncs=1), config=config)
        self.script = list(script)

    def decide(self, split: RoleSplit, *, now: float) -> RoleMove | None:
        if not self.script:
            return None
        direction = self.script.pop(0)
        if direction is None:
            return None
        return RoleMove(
            direction=direction,  # type: ignore[arg-type]
            replicas=1,
            before=split,
            after=split.moved(direction, 1),  # type: ignore[arg-type]
        )


def _run(planner_of: Any, steps: int, trainer_gpus: int = 1) -> tuple[Any, ...]:
    loop = _JumpLoop()
    try:
        cfg = DynamicScheduleConfig(
            ppo_mini_batch_size=4, trigger_parameter_sync_step=2, staleness_threshold=0.5
        )
        trainer = ElasticTrainer(trainer_gpus)
        replicas = ReplicaSet(
            standalone=[InMemoryReplica(f"s{i}", tokens_per_s=50.0) for i in range(3)]
        )
        mover = InMemoryRoleMover(replicas, trainer)
        assert isinstance(mover, RoleMover)
        planner = planner_of(cfg)
        moves: list[RoleMoveEvent] = []
        floop = FullyAsyncLoop.build(
            cfg,
            Never(),
            trainer,
            prompts=range(10_000),
            replicas=replicas,
            max_tokens=64,
            planner=planner,
            mover=mover,
        )
        floop.events.subscribe(moves.append, RoleMoveEvent)
        result = loop.run_until_complete(asyncio.wait_for(floop.run(num_steps=steps), 1e7))
    finally:
        loop.close()
    return result, trainer, mover, moves


def test_scripted_moves_both_ways_keep_every_sample_exactly_once() -> None:
    script = ["to_trainer", None, "to_rollout", "to_trainer", "to_trainer"]
    result, trainer, mover, moves = _run(lambda cfg: ScriptedPlanner(script, cfg), 14)
    assert [e.direction for e in moves] == ["to_trainer", "to_rollout", "to_trainer", "to_trainer"]
    assert all(e.seconds == pytest.approx(5.0) for e in moves)
    assert moves[-1].after == RoleSplit(trainer_gpus=3, standalone_replicas=1, gpus_per_replica=1)
    assert trainer.gpus == 3 and sorted(set(trainer.steps_on)) == [1, 2, 3]
    ids = result.consumed_sample_ids
    assert len(ids) == len(set(ids)) == 14 * 4
    assert result.samples_produced == result.samples_consumed + result.samples_left
    assert result.samples_failed == 0
    assert mover.retired and mover.started == 1


def test_without_a_planner_the_loop_refuses_a_lone_mover() -> None:
    cfg = DynamicScheduleConfig(ppo_mini_batch_size=2, trigger_parameter_sync_step=1)
    replicas = ReplicaSet(standalone=[InMemoryReplica("s0")])
    mover = InMemoryRoleMover(replicas, ElasticTrainer(1))
    with pytest.raises(ValueError, match="planner and mover go together"):
        FullyAsyncLoop.build(
            cfg, Never(), ElasticTrainer(1), prompts=range(4), replicas=replicas, mover=mover
        )


def test_the_fitted_planner_gives_a_training_bound_run_more_trainer_gpus() -> None:
    """One trainer GPU, three fast replicas: training is the bottleneck, so the planner
    moves replicas to the trainer, one at a time, keeping one replica."""
    options = RolePlannerOptions(every_n_syncs=2, move_cost_s=5.0, horizon_syncs=8)
    result, trainer, mover, moves = _run(lambda cfg: RolePlanner(options, config=cfg), 40)
    assert moves and all(e.direction == "to_trainer" for e in moves)
    assert trainer.gpus > 1 and mover.split().standalone_replicas >= 1
    assert len(set(result.consumed_sample_ids)) == 40 * 4
