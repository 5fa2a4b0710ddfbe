"""Elastic trainers on Ray: `RayTrainerGroup.resize` across worker actors, `RayRoleMover`,
and a run whose planner moves GPUs both ways.

Tolerance of the resized-against-unresized comparison (stated with its reason in
``test_elastic_torch``): rtol 1e-5, atol 1e-5 (1% of one AdamW step at ``lr = 1e-3``), at
most 1 in 10,000 elements beyond 1e-6; the ranks must agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from dynsched_core import DynamicScheduleConfig
from dynsched_core.planner import RoleMove, RoleSplit
from dynsched_ray import RayRunner, RayRunOptions, ResourcePools
from dynsched_ray.runtime.fleet import FleetSpec, RayFleet
from dynsched_ray.runtime.mover import RayRoleMover, RoleMoveError, install_planner
from dynsched_ray.runtime.remote import await_ref
from dynsched_ray.trainers.base import TrainerOptions
from dynsched_ray.trainers.elastic import TrainerResizeError
from dynsched_ray.trainers.group import RayTrainerGroup, RayTrainerSpec
from dynsched_ray.trainers.torch.trainer import TorchTrainer
from safetensors.torch import load

from ._policies import NeverActivatePolicy
from .test_trainer_ray import _make_batch

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

OPTIONS = TrainerOptions(lr=1e-3, ppo_mini_batch_size=2)
RTOL, ATOL, TIGHT, TIGHT_SHARE = 1e-5, 1e-5, 1e-6, 1e-4


def _spec(folder: Path, workers: int) -> RayTrainerSpec:
    return RayTrainerSpec(
        factory=TorchTrainer,
        args=(str(folder),),
        kwargs={"options": OPTIONS},
        make_batch=_make_batch,
        workers=workers,
    )


async def _train(group: RayTrainerGroup, batches: Sequence[Any], sizes: Sequence[int]) -> None:
    """One step per batch, a sync after each, then a resize to the next size."""
    for version, (batch, size) in enumerate(zip(batches, sizes, strict=True), start=1):
        await group.resize(size)
        await group.train_step(batch)
        await group.keep_synced(version)


async def _weights(group: RayTrainerGroup, rank: int) -> dict[str, torch.Tensor]:
    _, blob = await await_ref(
        group.workers[rank].export_weights.remote(True), timeout_s=120, what="export"
    )
    return load(blob)


async def test_a_group_resized_two_three_two_trains_like_an_unresized_one(
    tiny_model_dir: Path,
) -> None:
    from ._trainer_helpers import make_rl_batch

    batches = [make_rl_batch(tiny_model_dir, groups=5, seed=s) for s in range(3)]
    pools = ResourcePools.create(trainer_gpus=3, standalone_replicas=0, name_prefix="elastic")
    groups: list[RayTrainerGroup] = []
    try:
        await pools.ready(60)
        resized = await RayTrainerGroup.launch(
            pools, _spec(tiny_model_dir, 2), gpu_fraction=0.3, name="elastic-a", call_timeout_s=300
        )
        groups.append(resized)
        assert resized.bundles == 3
        with pytest.raises(ValueError, match=r"workers must be in \[1, 3\].*got 4"):
            await resized.resize(4)
        await resized.train_step(batches[0])
        with pytest.raises(TrainerResizeError, match="sync boundary"):
            await resized.resize(3)
        await resized.keep_synced(1)
        assert await resized.resize(3) > 0
        info = await resized.describe()
        assert [d["rank"] for d in info] == [0, 1, 2] and {d["world_size"] for d in info} == {3}
        assert {d["placement"]["placement_group_id"] for d in info} == {pools.ids()["trainer"]}
        assert len({d["pid"] for d in info}) == 3 and {d["version"] for d in info} == {1}
        assert resized.handover.holders(2).trainer_resident
        await resized.train_step(batches[1])
        await resized.keep_synced(2)
        await resized.resize(2)
        assert [d["world_size"] for d in await resized.describe()] == [2, 2]
        assert not resized.handover.holders(2).trainer_resident  # GPU 2 is free again
        await resized.train_step(batches[2])
        got, other = await _weights(resized, 0), await _weights(resized, 1)

        plain = await RayTrainerGroup.launch(
            pools, _spec(tiny_model_dir, 2), gpu_fraction=0.3, name="elastic-b", call_timeout_s=300
        )
        groups.append(plain)
        await _train(plain, batches, [2, 2, 2])
        want = await _weights(plain, 0)
    finally:
        for g in groups:
            g.shutdown()
        pools.remove()
    beyond = total = 0
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=RTOL, atol=ATOL, msg=k)
        assert torch.equal(got[k], other[k]), k
        beyond += int(((got[k] - want[k]).abs() > TIGHT).sum())
        total += want[k].numel()
    assert beyond <= TIGHT_SHARE * total, (beyond, total)


def _move(split: RoleSplit, direction: str, replicas: int = 1) -> RoleMove:
    return RoleMove(
        direction=direction,  # type: ignore[arg-type]
        replicas=replicas,
        before=split,
        after=split.moved(direction, replicas),  # type: ignore[arg-type]
    )


async def test_the_mover_retires_and_starts_standalone_replicas_through_the_set(
    tiny_model_dir: Path,
) -> None:
    spec = FleetSpec(
        name="mover-test",
        trainer_gpus=3,
        standalone_replicas=2,
        hybrid_replicas=0,
        trainer_workers=0,
        call_timeout_s=60.0,
        start_timeout_s=120.0,
    )
    fleet = await RayFleet.launch(spec)
    group = None
    try:
        replicas = fleet.replica_set()
        await replicas.route(replicas.standalone_ids)
        group = await RayTrainerGroup.launch(
            fleet.pools, _spec(tiny_model_dir, 2), name="mover-test", call_timeout_s=300
        )
        mover = RayRoleMover(group, replicas, fleet, weights=lambda: (3, None))
        split = mover.split()
        assert split == RoleSplit(trainer_gpus=2, standalone_replicas=2, gpus_per_replica=1)
        with pytest.raises(RoleMoveError, match="free bundle"):
            await mover.move(_move(split, "to_rollout"))
        with pytest.raises(RoleMoveError, match=r"bundles for \[1, 3\]"):
            await mover.move(_move(split, "to_trainer", 2))
        assert mover.split() == split  # refused: nothing changed

        await mover.move(_move(split, "to_trainer"))
        assert mover.split() == RoleSplit(trainer_gpus=3, standalone_replicas=1, gpus_per_replica=1)
        assert mover.retired == ["standalone-1"] and "standalone-1" not in replicas
        assert await fleet.router.routable() == ["standalone-0"]
        assert len(group.workers) == 3
        with pytest.raises(RoleMoveError, match="stale move"):
            await mover.move(_move(split, "to_trainer"))

        await mover.move(_move(mover.split(), "to_rollout"))
        assert mover.split() == split and mover.retired == []
        assert sorted(await fleet.router.routable()) == ["standalone-0", "standalone-1"]
        back = replicas["standalone-1"]
        assert await back.call("weights_version") == 3  # current weights before serving
        assert replicas.placement_of("standalone-1").pool == "standalone"
        assert [d for d, _, _ in mover.history] == ["to_trainer", "to_rollout"]
    finally:
        if group is not None:
            group.shutdown()
        fleet.shutdown()


class _SeesawPlanner:
    """Moves one replica every sync, to the trainer while it can, then back: a planner
    whose moves the test knows in advance (the real `RolePlanner` decides from models)."""

    def __init__(self) -> None:
        from dynsched_core.planner import RolePlannerOptions

        self.options = RolePlannerOptions(every_n_syncs=1)
        self.moves: list[tuple[RoleMove, float]] = []

    def attach(self, events: Any, split: Any, estimate: Any = None) -> None:
        pass

    def observe_batch(self, samples: Sequence[Any]) -> None:
        pass

    def decide(self, split: RoleSplit, *, now: float) -> RoleMove | None:
        direction = "to_trainer" if split.trainer_gpus == 1 else "to_rollout"
        return _move(split, direction)

    def record_move(self, move: RoleMove, seconds: float, *, now: float) -> None:
        self.moves.append((move, seconds))


async def test_a_run_whose_planner_moves_gpus_both_ways_trains_every_sample_once(
    tiny_model_dir: Path,
) -> None:
    config = DynamicScheduleConfig.from_dict(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": 1,
                "staleness_threshold": 0.5,
                "partial_rollout": True,
            },
            "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}},
        }
    )
    opt = RayRunOptions(
        name="planner-run",
        num_steps=5,
        trainer=_spec(tiny_model_dir, 1),  # one of the two trainer bundles: room to grow
        max_tokens=16,
        min_response_len=4,
        max_response_len=12,
        call_timeout_s=120.0,
        wait_timeout_s=120.0,
    )
    planner = _SeesawPlanner()
    runner: RayRunner = RayRunner(
        config,
        opt,
        policy=NeverActivatePolicy(),
        on_loop_built=install_planner(planner, lambda: runner),
    )
    result = await runner.run()
    assert result.loop.steps == 5 and result.loop.samples_failed == 0
    directions = [m.direction for m, _ in planner.moves]
    assert directions == ["to_trainer", "to_rollout"] * 2 + ["to_trainer"], directions
    ids = result.consumed_sample_ids
    assert len(ids) == len(set(ids)) == 5 * config.required_samples
    assert [m.version for m in result.trainer_metrics] == [1, 2, 3, 4, 5]
