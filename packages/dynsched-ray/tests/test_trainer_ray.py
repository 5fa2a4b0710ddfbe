"""Real trainers as Ray actors on the trainer pool: data parallel, hand-over, a full run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from dynsched_core import DynamicScheduleConfig, InMemoryReplica
from dynsched_core.errors import HandOverError
from dynsched_core.trainer import HandOverReplica, TrainBatch, TrainResponse
from dynsched_ray import (
    RayReplica,
    RayRunner,
    RayRunOptions,
    RayTrainerGroup,
    RayTrainerSpec,
    ReplicaActor,
    ResourcePools,
    TorchTrainer,
    TrainerOffloadedError,
    TrainerOptions,
    remote_class,
)
from safetensors.torch import load

from ._policies import AlwaysSwitchPolicy

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

OPTIONS = TrainerOptions(lr=1e-3)


def _spec(folder: Path, **kw: Any) -> RayTrainerSpec:
    return RayTrainerSpec(
        factory=TorchTrainer,
        args=(str(folder),),
        kwargs={"options": OPTIONS},
        make_batch=_make_batch,
        **kw,
    )


async def test_data_parallel_workers_on_the_trainer_bundles_and_the_hand_over(
    tiny_model_dir: Path, rl_batch: TrainBatch
) -> None:
    pools = ResourcePools.create(trainer_gpus=2, standalone_replicas=0, name_prefix="dp-test")
    group = None
    hybrid_handle = None
    try:
        await pools.ready(60)
        group = await RayTrainerGroup.launch(
            pools, _spec(tiny_model_dir), gpu_fraction=0.5, name="dp-test", call_timeout_s=120
        )
        info = await group.describe()
        assert [d["rank"] for d in info] == [0, 1] and {d["world_size"] for d in info} == {2}
        assert {d["placement"]["placement_group_id"] for d in info} == {pools.ids()["trainer"]}
        assert len({d["pid"] for d in info}) == 2

        # one data-parallel step: both ranks apply the same update, equal to one process
        # training on the whole batch (up to float summation order)
        metrics = await group.train_step(rl_batch)
        single = TorchTrainer(tiny_model_dir, OPTIONS)
        expected = single.train_step(rl_batch)
        assert metrics.loss == pytest.approx(expected.loss, abs=1e-6)
        assert metrics.grad_norm == pytest.approx(expected.grad_norm, rel=1e-4)
        assert metrics.num_tokens == rl_batch.num_response_tokens and metrics.version == 1
        w0 = load((await group.export_weights())[1])
        from dynsched_ray.runtime.remote import await_ref

        _, blob1 = await await_ref(
            group.workers[1].export_weights.remote(True), timeout_s=60, what="export"
        )
        w1 = load(blob1)
        assert all(torch.equal(w0[k], w1[k]) for k in w0)

        # a hybrid replica actor on bundle 0, next to worker 0
        hybrid_handle = (
            remote_class(ReplicaActor)
            .options(num_cpus=0, num_gpus=0.5, scheduling_strategy=pools.hybrid_strategy(0))
            .remote(InMemoryReplica, ("dp-hybrid",), {"role": "hybrid"})
        )
        proxy = await RayReplica.connect(hybrid_handle, timeout_s=60)
        strict = HandOverReplica(proxy, group.handover, [0])
        with pytest.raises(HandOverError, match="has not offloaded"):
            await strict.wake_up()  # worker 0 still holds GPU 0: refused, replica untouched
        group.handover.forget_hybrid("dp-hybrid")
        hybrid = group.hybrid(proxy, [0])
        before = (await group.memory())[0]
        await hybrid.wake_up()  # offloads worker 0 first, then wakes
        assert group.is_offloaded(0) and not group.is_offloaded(1)
        after = (await group.memory())[0]
        assert before.device_bytes > 0 and after.device_bytes == 0
        assert after.host_bytes == before.device_bytes
        with pytest.raises(TrainerOffloadedError):
            await group.train_step(rl_batch)  # worker 0 is offloaded
        with pytest.raises(HandOverError, match="dp-hybrid"):
            await group.acquire()  # the hybrid on GPU 0 is awake
        assert group.is_offloaded(0)  # nothing was reloaded
        await hybrid.sleep()
        reloaded = await group.acquire()
        assert len(reloaded) == 1 and reloaded[0].after.device_bytes == before.device_bytes
        again = await group.train_step(rl_batch)
        assert again.version == 2
        events = [e for e, _ in group.handover.log]
        assert events.index("trainer_offloaded") < events.index("hybrid_waking:dp-hybrid")
        assert events.index("hybrid_asleep:dp-hybrid") < events.index("trainer_reloading")
    finally:
        if group is not None:
            group.shutdown()
        if hybrid_handle is not None:
            import ray

            ray.kill(hybrid_handle, no_restart=True)
        pools.remove()


def _make_batch(samples: Sequence[Any], version: int) -> TrainBatch:
    """In-memory replicas produce token ids without logprobs: stand in uniform ones."""
    out = []
    for s in samples:
        prompt = [3 + (hash(s.sample_id) % 97), 5, 7]
        for k, o in enumerate(s.responses):
            tokens = [3 + t % 500 for t in o.output_tokens][:24]
            out.append(
                TrainResponse(
                    prompt_ids=prompt,
                    response_ids=tokens,
                    logprobs=[-6.0] * len(tokens),
                    reward=float(k % 2),
                    group_id=s.sample_id,
                    versions=o.param_versions,
                )
            )
    return TrainBatch(responses=out, version=version)


async def test_run_with_a_real_trainer_hands_the_gpu_over_in_order(tiny_model_dir: Path) -> None:
    config = DynamicScheduleConfig.from_dict(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": 1,
                "staleness_threshold": 0.5,
                "partial_rollout": True,
            },
            "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}},
        }
    )
    opt = RayRunOptions(
        name="trainer-run",
        num_steps=4,
        trainer=_spec(tiny_model_dir),
        max_tokens=16,
        min_response_len=4,
        max_response_len=12,
        call_timeout_s=120.0,
        wait_timeout_s=120.0,
    )
    runner = RayRunner(config, opt, policy=AlwaysSwitchPolicy())
    result = await runner.run()
    assert result.loop.steps == 4 and result.loop.samples_failed == 0
    assert [m.version for m in result.trainer_metrics] == [1, 2, 3, 4]
    assert all(m.num_tokens > 0 for m in result.trainer_metrics)
    assert "activate" in result.switches and "deactivate" in result.switches
    group = runner.trainer_group
    assert group is not None
    log = [e for e, _ in group.handover.log]
    # every wake of the hybrid replica follows an offload of the trainer on GPU 0, and
    # every reload follows the hybrid's sleep
    for i, e in enumerate(log):
        if e.startswith("hybrid_waking"):
            prior = [x for x in log[:i] if x in ("trainer_offloaded", "trainer_reloading")]
            assert prior and prior[-1] == "trainer_offloaded", log
        if e == "trainer_reloading":
            prior = [x for x in log[:i] if x.startswith(("hybrid_waking", "hybrid_asleep"))]
            assert prior and prior[-1].startswith("hybrid_asleep"), log
    assert log.count("hybrid_waking:hybrid-0") >= 2
    offloads = [r for _, r in group.reports if r.direction == "offload"]
    assert offloads and all(r.after.device_bytes == 0 for r in offloads)
