"""Hybrid replicas land on the trainer pool's bundles, standalone replicas on theirs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dynsched_core import InMemoryReplica, ReplicaSet
from dynsched_core.trainer import GpuHandOver, HandOverReplica
from dynsched_ray import FleetSpec, RayFleet, ResourcePools
from dynsched_ray.runtime.fleet import plan_replicas
from dynsched_ray.runtime.supervisor import ReplicaSupervisor, RestartOptions

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


async def test_hybrid_on_trainer_bundles_and_standalone_on_their_own() -> None:
    spec = FleetSpec(name="place", trainer_gpus=2, standalone_replicas=2, trainer_workers=2)
    fleet = await RayFleet.launch(spec)
    try:
        ids = fleet.pools.ids()
        assert ids["trainer"] and ids["standalone"] and ids["trainer"] != ids["standalone"]
        trainer = await fleet.trainer_placements()
        assert [p["placement_group_id"] for p in trainer] == [ids["trainer"]] * 2
        for i, (rid, replica) in enumerate(sorted(fleet.hybrid.items())):
            assert replica.capabilities.role == "hybrid"
            assert replica.placement["placement_group_id"] == ids["trainer"], rid
            # the very GPU of trainer worker i (bundle i), at a fraction of it
            assert replica.placement["gpu_ids"] == trainer[i]["gpu_ids"]
            assert replica.placement["assigned_resources"]["GPU"] == pytest.approx(0.5)
            assert trainer[i]["assigned_resources"]["GPU"] == pytest.approx(0.5)
        trainer_gpus = {g for p in trainer for g in p["gpu_ids"]}
        assert len(trainer_gpus) == 2
        standalone_gpus: set[str] = set()
        for rid, replica in fleet.standalone.items():
            assert replica.capabilities.role == "standalone"
            assert replica.placement["placement_group_id"] == ids["standalone"], rid
            assert replica.placement["assigned_resources"]["GPU"] == pytest.approx(1.0)
            standalone_gpus.update(replica.placement["gpu_ids"])
        assert len(standalone_gpus) == 2
        assert not standalone_gpus & trainer_gpus
        # routing is the run's ReplicaSet's to decide: a launched fleet routes nothing
        assert fleet.router.routable_ids() == [] == await fleet.router.refresh()
        tables = fleet.pools.table()
        assert len(tables["trainer"]["bundles"]) == 2
        assert tables["standalone"]["bundles"][0] == {"GPU": 1.0}
    finally:
        fleet.shutdown()


def test_pool_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="strategy must be one of"):
        ResourcePools.create(trainer_gpus=1, standalone_replicas=1, strategy="TIGHT")
    with pytest.raises(ValueError, match="gpus_per_replica"):
        ResourcePools.create(trainer_gpus=1, standalone_replicas=1, gpus_per_replica=0)
    with pytest.raises(ValueError, match="hybrid_replicas must be in"):
        FleetSpec(trainer_gpus=2, hybrid_replicas=3)


def test_the_plan_computes_every_replicas_gpus_once() -> None:
    spec = FleetSpec(trainer_gpus=4, standalone_replicas=2, gpus_per_replica=2)
    plan = {p.replica_id: p for p in plan_replicas(spec)}
    assert list(plan) == ["standalone-0", "standalone-1", "hybrid-0", "hybrid-1"]
    assert [(p.placement.pool, p.placement.bundle, p.placement.gpu_ids) for p in plan.values()] == [
        ("standalone", 0, (0, 1)),
        ("standalone", 1, (2, 3)),
        ("trainer", 0, (0, 1)),
        ("trainer", 2, (2, 3)),
    ]
    assert plan["hybrid-1"].spec.options == {"role": "hybrid", "num_gpus": 2}


async def test_a_killed_hybrid_respawns_on_its_gpus_and_the_hand_over_forgets_it() -> None:
    spec = FleetSpec(name="record", trainer_gpus=2, standalone_replicas=1, trainer_workers=0)
    members: list[ReplicaSet] = []
    fleet = await RayFleet.launch(spec, on_death=lambda rid, exc: members[0].mark_dead(rid))
    handover = GpuHandOver()
    for gpu in (0, 1):
        handover.register_trainer(gpu, resident=False)
    supervisor: ReplicaSupervisor | None = None
    try:
        wrapped = {
            rid: HandOverReplica(proxy, handover, fleet.placement_of(rid).gpu_ids)
            for rid, proxy in fleet.hybrid.items()
        }
        replicas = fleet.replica_set(hybrid=wrapped)
        members.append(replicas)
        handover.follow(replicas)  # no hand call from a runner below
        before = replicas.placement_of("hybrid-1")
        assert before.gpu_ids == (1,) and before.pool == "trainer" and before.node

        def wrap(proxy: Any) -> HandOverReplica:
            return HandOverReplica(proxy, handover, replicas.placement_of(proxy.replica_id).gpu_ids)

        supervisor = ReplicaSupervisor(
            fleet,
            replicas,
            weights=lambda: (0, None),
            options=RestartOptions(restart_delay_s=0.5, restart_timeout_s=60.0),
            on_death=lambda rid, exc: replicas.mark_dead(rid),
            wrap_hybrid=wrap,
        )
        supervisor.start()
        old = fleet.replicas["hybrid-1"]
        fleet.kill_replica("hybrid-1")
        for _ in range(200):  # ray.kill is asynchronous: ping until it is found dead
            if not await old.ping(timeout_s=10.0):
                break
            await asyncio.sleep(0.05)
        assert old.is_dead  # found dead: the set heard of it through the death callback
        assert replicas.dead_ids == ["hybrid-1"]
        assert ("forget:hybrid-1", None) in handover.log  # the hand-over followed the set
        for _ in range(600):
            if replicas.is_alive("hybrid-1"):
                break
            await asyncio.sleep(0.1)
        assert supervisor.history and supervisor.history[-1].ok
        fresh = replicas["hybrid-1"]
        assert isinstance(fresh, HandOverReplica) and fresh.gpus == (1,)
        after = replicas.placement_of("hybrid-1")
        assert (after.pool, after.bundle, after.gpu_ids) == (before.pool, before.bundle, (1,))
        assert fleet.replicas["hybrid-1"] is fresh.inner and fresh.inner is not old
        assert old in fleet.retired and replicas.member("hybrid-1").spec is not None
        handover.hybrid_waking("hybrid-1")  # registered again, on its own GPU
        assert handover.holders(1).awake == ("hybrid-1",) and handover.holders(0).awake == ()
    finally:
        if supervisor is not None:
            await supervisor.stop()
        fleet.shutdown()


async def test_a_restart_that_cannot_be_placed_is_given_up_and_reported() -> None:
    class NoRoom:
        def __init__(self) -> None:
            self.replicas = {"standalone-0": None}
            self.attached: ReplicaSet | None = None

        def attach(self, replicas: ReplicaSet) -> None:
            self.attached = replicas

        async def respawn_replica(self, replica_id: str, **kw: Any) -> Any:
            raise RuntimeError("no room on any node")

    replicas = ReplicaSet(standalone=[InMemoryReplica("standalone-0")])
    fleet, lines = NoRoom(), []
    supervisor = ReplicaSupervisor(
        fleet,  # type: ignore[arg-type]
        replicas,
        weights=lambda: (0, None),
        options=RestartOptions(restart_delay_s=0.0, attempts=2),
        progress=lines.append,
    )
    assert fleet.attached is replicas  # the fleet reads the set's records from now on
    supervisor.start()
    replicas.mark_dead("standalone-0")
    for _ in range(200):
        if supervisor.history:
            break
        await asyncio.sleep(0.01)
    [record] = supervisor.history
    assert not record.ok and record.downtime_s is None and record.version is None
    assert record.attempts == 2 and record.error == "RuntimeError: no room on any node"
    assert lines == [f"replica standalone-0 could not be restarted: {record.error}"]
    assert supervisor.can_restart_any()  # budget left: 1 of 3 restarts used
    await supervisor.stop()
