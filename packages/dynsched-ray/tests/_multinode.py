"""A run on an in-process multi-node Ray cluster; a node is removed mid-run.

Run as a script (its own Ray cluster, apart from the test session's): ``python
_multinode.py OUT.json``. Three nodes: a head without GPUs (the driver), node A with the
trainer pool's 2 GPUs (trainer worker, hybrid replicas), node B with the standalone
pool's 2 GPUs. After step 2, node B is removed (both standalone replicas die at once,
while the hybrid replicas sleep) and node C, with 2 GPUs, joins: Ray re-places the
standalone placement group's bundles there and the supervisor restarts the replicas on
them. Writes what happened as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

# ray.cluster_utils starts its nodes without ray.init's default: ask for token
# authentication explicitly (before Ray reads its settings at import).
os.environ.setdefault("RAY_AUTH_MODE", "token")

import ray
from dynsched_core import DynamicScheduleConfig, DynamicSchedulePolicyBase
from dynsched_ray import RayRunner, RayRunOptions, synthetic_prompts
from ray.cluster_utils import Cluster

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
STEPS = 10
NODE = {"num_cpus": 1, "num_gpus": 2, "object_store_memory": 80 * 1024 * 1024}


class NeverActivate(DynamicSchedulePolicyBase):
    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return False


async def main(out_path: str) -> None:
    head = {"num_cpus": 2, "num_gpus": 0, "object_store_memory": 80 * 1024 * 1024}
    from ray._private.authentication.authentication_token_setup import (
        ensure_token_if_auth_enabled,
    )

    ensure_token_if_auth_enabled()  # ~/.ray/auth_token, made if missing
    for attempt in range(3):  # a loaded machine can time out a node's start-up
        try:
            cluster = Cluster(initialize_head=True, head_node_args=head)
            break
        except Exception as exc:
            print(f"cluster start failed ({exc}); retrying", flush=True)
            if attempt == 2:
                raise
    node_a = cluster.add_node(**NODE)
    node_b: Any = None
    ray.init(address=cluster.address, namespace="multinode", log_to_driver=False)
    report: dict[str, Any] = {}
    try:
        runner: RayRunner | None = None
        removed = asyncio.Event()
        restarted: set[str] = set()
        all_back = asyncio.Event()

        async def remove_b() -> None:
            assert runner is not None and runner.fleet is not None
            fleet = runner.fleet
            report["nodes_before"] = {
                rid: r.placement.get("node_id") for rid, r in fleet.replicas.items()
            }
            host = report["nodes_before"]["standalone-0"]
            victim = next(n for n in cluster.list_all_nodes() if n.node_id == host)
            report["removed_node"] = host
            await asyncio.to_thread(cluster.remove_node, victim)
            removed.set()
            await asyncio.sleep(1.0)  # the run goes on without the node for a while
            # room for the standalone bundles again: Ray re-places them on node C (a node
            # is started from the main thread: Ray installs signal handlers)
            cluster.add_node(**NODE)

        tasks: list[asyncio.Task[None]] = []

        def progress(line: str) -> None:
            print(line, flush=True)
            if line.startswith("step 2/") and not tasks:
                tasks.append(asyncio.ensure_future(remove_b()))
            if line.startswith("replica standalone-") and "restarted" in line:
                restarted.add(line.split()[1])
                if len(restarted) == 2:
                    all_back.set()

        opt = RayRunOptions(
            name="multinode",
            num_steps=STEPS,
            trainer_workers=1,
            tokens_per_s=1500.0,
            trainer_step_time_s=0.05,
            health_check_interval_s=0.2,
            call_timeout_s=30.0,
            wait_timeout_s=120.0,
            no_replica_timeout_s=120.0,
            replica_restarts=2,
            restart_timeout_s=90.0,
            placement_strategy="STRICT_PACK",
        )

        async def prompts() -> Any:
            source = synthetic_prompts(
                2 * STEPS * CONFIG.required_samples + 8,
                max_tokens=opt.max_tokens,
                prompt_len=opt.prompt_len,
                n=CONFIG.n,
                min_len=opt.min_response_len,
                max_len=opt.max_response_len,
            )
            for i, prompt in enumerate(source):
                if i == 7 * CONFIG.required_samples:  # later prompts: after the restarts
                    await asyncio.wait_for(all_back.wait(), 240)
                yield prompt

        # STRICT_PACK keeps each pool on one node: one node per pool
        node_b = cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        runner = RayRunner(
            CONFIG,
            opt,
            policy=NeverActivate(),
            keep_samples=True,
            progress=progress,
            prompts=prompts(),
        )
        res = await asyncio.wait_for(runner.run(), 400)
        assert runner.fleet is not None
        report.update(
            node_a=node_a.node_id,
            node_b=node_b.node_id,
            removed=removed.is_set(),
            steps=res.loop.steps,
            consumed=list(res.consumed_sample_ids),
            produced=res.loop.samples_produced,
            consumed_count=res.loop.samples_consumed,
            left=res.loop.samples_left,
            failed=res.loop.samples_failed,
            failovers=res.failovers,
            restarts=[
                {"replica_id": r.replica_id, "ok": r.ok, "version": r.version} for r in res.restarts
            ],
            dead=list(res.dead_replicas),
            queue_restarts=res.queue_restarts,
            router_restarts=res.router_restarts,
            nodes_after={
                rid: r.placement.get("node_id") for rid, r in runner.fleet.replicas.items()
            },
            late_replicas=sorted(
                {
                    rid
                    for s in runner.consumed_samples[-4:]
                    for r in s.responses
                    for rid in r.replica_ids
                }
            ),
        )
    finally:
        Path(out_path).write_text(json.dumps(report), encoding="utf-8")  # noqa: ASYNC240
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
