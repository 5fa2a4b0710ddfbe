"""Hybrid replicas land on the trainer pool's bundles, standalone replicas on theirs."""

from __future__ import annotations

import pytest
from dynsched_ray import FleetSpec, RayFleet, ResourcePools

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
