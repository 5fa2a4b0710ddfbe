"""Faults over Ray actors: failover to the hybrid replicas, replica restarts, queue and
router actors replaced mid-run. Nothing lost, nothing trained twice."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import ray
from dynsched_ray import RayRunner, synthetic_prompts

from ._policies import NeverActivatePolicy, ScriptedPolicy
from .test_e2e import CONFIG, _options

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

STEPS = 8


def _check_nothing_lost(runner: RayRunner, res: Any, steps: int = STEPS) -> None:
    loop = res.loop
    assert loop.steps == steps
    assert loop.samples_failed == 0
    assert loop.samples_produced == loop.samples_consumed + loop.samples_left
    ids = res.consumed_sample_ids
    assert len(ids) == len(set(ids)) == steps * CONFIG.required_samples
    for sample in runner.consumed_samples:
        for r in sample.responses:  # whole responses, across retries and restarts
            assert r.output_tokens == tuple(range(r.num_tokens))


def _after_step(step: int, action: Any) -> Any:
    done: list[int] = []

    def progress(line: str) -> None:
        if line.startswith(f"step {step}/") and not done:
            done.append(step)
            action()

    return progress


async def test_all_standalone_killed_while_hybrids_sleep_fails_over_to_them() -> None:
    runner: RayRunner | None = None

    def kill_standalone() -> None:
        assert runner is not None and runner.fleet is not None
        for rid in list(runner.fleet.standalone):
            runner.fleet.kill_replica(rid)

    opt = _options(
        "failover",
        num_steps=STEPS,
        tokens_per_s=800.0,
        wait_timeout_s=30.0,
        no_replica_timeout_s=30.0,
    )
    runner = RayRunner(
        CONFIG,
        opt,
        policy=NeverActivatePolicy(),
        keep_samples=True,
        progress=_after_step(2, kill_standalone),
    )
    res = await asyncio.wait_for(runner.run(), 180)
    assert set(res.dead_replicas) == {"standalone-0", "standalone-1"}
    assert res.failovers >= 1
    assert res.loop.activations + res.failovers >= 1
    _check_nothing_lost(runner, res)
    # after the loss only hybrid replicas generated
    late = {rid for s in runner.consumed_samples[-2:] for r in s.responses for rid in r.replica_ids}
    assert late and late <= {"hybrid-0", "hybrid-1"}


async def test_dead_standalone_replica_is_restarted_warm_and_routed_again() -> None:
    runner: RayRunner | None = None
    restarted = asyncio.Event()
    killed: list[str] = []

    def progress(line: str) -> None:
        assert runner is not None and runner.fleet is not None
        if line.startswith("step 2/") and not killed:
            killed.append("standalone-0")
            runner.fleet.kill_replica("standalone-0")
        if line.startswith("replica standalone-0 restarted"):
            restarted.set()

    async def prompts() -> Any:
        # the second half of the prompts waits for the restart (however slow the
        # machine), so the restarted replica has work left to serve
        opt = runner.options if runner is not None else None
        assert opt is not None
        for i, prompt in enumerate(
            synthetic_prompts(
                2 * STEPS * CONFIG.required_samples + 8,
                max_tokens=opt.max_tokens,
                prompt_len=opt.prompt_len,
                n=CONFIG.n,
                min_len=opt.min_response_len,
                max_len=opt.max_response_len,
            )
        ):
            if i == STEPS * CONFIG.required_samples // 2:
                await asyncio.wait_for(restarted.wait(), 120)
            yield prompt

    opt = _options("restart-replica", num_steps=STEPS, replica_restarts=2)
    runner = RayRunner(
        CONFIG,
        opt,
        policy=ScriptedPolicy(),
        keep_samples=True,
        progress=progress,
        prompts=prompts(),
    )
    res = await asyncio.wait_for(runner.run(), 180)
    _check_nothing_lost(runner, res)
    assert res.dead_replicas == ()  # back among the living
    assert len(res.restarts) == 1
    restart = res.restarts[0]
    assert restart.ok and restart.replica_id == "standalone-0" and restart.role == "standalone"
    assert restart.version is not None and restart.version >= 1  # warmed, not version 0
    assert restart.downtime_s is not None and restart.downtime_s > 0
    assert runner.replicas is not None and runner.replicas.is_routable("standalone-0")
    # it served again after its restart
    served = [rid for s in runner.consumed_samples for r in s.responses for rid in r.replica_ids]
    last_before = max(i for i, rid in enumerate(served) if rid == "standalone-0")
    assert last_before > len(served) // 2


async def test_queue_actor_killed_with_samples_loses_and_repeats_nothing() -> None:
    runner: RayRunner | None = None
    seen: list[int] = []

    async def kill_when_full() -> None:
        assert runner is not None and runner.fleet is not None
        queue = runner.fleet.queue
        for _ in range(2000):
            size = await queue.size()
            if size >= 2:
                seen.append(size)
                ray.kill(queue.handle, no_restart=True)
                return
            await asyncio.sleep(0.01)

    tasks: list[asyncio.Task[None]] = []

    def progress(line: str) -> None:
        if line.startswith("step 3/") and not tasks:
            tasks.append(asyncio.ensure_future(kill_when_full()))

    opt = _options("kill-queue", num_steps=STEPS, trainer_step_time_s=0.1)
    runner = RayRunner(CONFIG, opt, policy=ScriptedPolicy(), keep_samples=True, progress=progress)
    res = await asyncio.wait_for(runner.run(), 180)
    assert seen and seen[0] >= 2  # it held samples when it died
    assert res.queue_restarts == 1
    assert runner.fleet is not None and runner.fleet.queue.restored_samples >= 2
    _check_nothing_lost(runner, res)


async def test_router_actor_killed_mid_run_is_replaced() -> None:
    runner: RayRunner | None = None

    def kill() -> None:
        assert runner is not None and runner.fleet is not None
        ray.kill(runner.fleet.router.handle, no_restart=True)

    opt = _options("kill-router", num_steps=STEPS)
    runner = RayRunner(
        CONFIG, opt, policy=ScriptedPolicy(), keep_samples=True, progress=_after_step(3, kill)
    )
    res = await asyncio.wait_for(runner.run(), 180)
    assert res.router_restarts == 1
    _check_nothing_lost(runner, res)
