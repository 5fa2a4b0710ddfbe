"""The Ray runner's path for the widened decisions: partial lending (k of m) and mid-cycle
activation (the replica loads the current weights), with in-memory engines in actors."""

from __future__ import annotations

from typing import Any

import pytest
from dynsched_core import DynamicScheduleConfig
from dynsched_ray import RayRunner, RayRunOptions

from ._policies import OnePerNodePolicy, PartialMidCyclePolicy

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

CONFIG = DynamicScheduleConfig.from_dict(
    {
        "async_training": {
            "use_dynamic_resource_scheduling": True,
            "trigger_parameter_sync_step": 2,
            "staleness_threshold": 0.5,
            "concurrent_samples_per_replica": 2,
            "partial_rollout": True,
        },
        "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
        "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}},
    }
)
STEPS = 6


async def _run(policy: Any, name: str, steps: int) -> RayRunner:
    """Run ``policy`` over Ray with in-memory engines; check every sample was kept once."""
    opt = RayRunOptions(
        name=name,
        num_steps=steps,
        trainer_workers=1,
        tokens_per_s=2000.0,
        trainer_step_time_s=0.02,
        health_check_interval_s=0.2,
        call_timeout_s=30.0,
        wait_timeout_s=60.0,
        no_replica_timeout_s=20.0,
    )
    runner = RayRunner(CONFIG, opt, policy=policy, keep_samples=True)
    res = await runner.run()
    loop = res.loop
    assert loop.steps == steps and loop.samples_failed == 0
    assert loop.samples_produced == loop.samples_consumed + loop.samples_left
    ids = res.consumed_sample_ids
    assert len(ids) == len(set(ids)) == steps * CONFIG.required_samples
    return runner


async def test_partial_mid_cycle_lending_over_ray_keeps_every_sample_once() -> None:
    policy = PartialMidCyclePolicy()
    runner = await _run(policy, "partial-mid-cycle", STEPS)
    for sample in runner.consumed_samples:
        for r in sample.responses:  # whole responses, across migrations, in order
            assert r.output_tokens == tuple(range(r.num_tokens))
    assert runner.loop is not None
    driver = runner.loop.driver
    assert driver.mid_cycle_activations >= 1
    assert CONFIG.num_hybrid_replicas == 2
    assert policy.lent_counts and set(policy.lent_counts) == {1}  # one of the two, each time
    assert runner.loop.controller.active_hybrid_ids == ()


async def test_lending_per_node_names_the_ray_node_of_each_hybrid() -> None:
    import ray

    policy = OnePerNodePolicy()
    await _run(policy, "one-per-node", 4)
    # one Ray node here: both hybrid replicas report it, so one per node lends one of two
    node = ray.get_runtime_context().get_node_id()
    assert policy.nodes_seen and set(policy.nodes_seen) == {(node, node)}
    assert set(policy.lent_counts) == {1}
