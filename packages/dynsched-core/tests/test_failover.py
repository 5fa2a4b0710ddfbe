"""Failover: every standalone replica dies while the hybrid replicas sleep.

Without failover the trainer's collection waits until ``wait_timeout_s`` and raises; with
it the driver wakes the hybrid replicas (current weights) at once, the run completes in
colocated-like mode and no sample is lost or trained twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dynsched_core import (
    AsyncSampleQueue,
    DriverOptions,
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    EventBus,
    FullyAsyncLoop,
    InMemoryReplica,
    ReplicaSet,
)
from dynsched_core.errors import SampleWaitTimeoutError
from dynsched_core.events import FailoverEvent

CFG = DynamicScheduleConfig(
    use_dynamic_resource_scheduling=True,
    ppo_mini_batch_size=2,
    n=1,
    trigger_parameter_sync_step=2,
    partial_rollout=True,
)


class NeverActivate(DynamicSchedulePolicyBase):
    """Hybrid replicas sleep unless a guard rail (or a failover) wakes them."""

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return False


class Trainer:
    def __init__(self) -> None:
        self.hybrid_awake_while_training: list[int] = []
        self.loop: FullyAsyncLoop | None = None
        self.steps = 0
        self.versions: list[int] = []

    async def train_step(self, samples: Any) -> dict[str, float]:
        self.steps += 1
        assert self.loop is not None
        if self.loop.controller.is_hybrid_active:
            self.hybrid_awake_while_training.append(self.steps)
        await asyncio.sleep(0.001)
        return {"update_actor": 0.001}

    async def sync_weights(self, version: int) -> dict[str, int]:
        self.versions.append(version)
        return {"version": version}


def _build(*, failover: bool, wait_timeout_s: float = 2.0) -> tuple[FullyAsyncLoop, Trainer]:
    standalone = [InMemoryReplica(f"s{i}", tokens_per_s=2000.0) for i in range(2)]
    hybrid = [InMemoryReplica(f"h{i}", role="hybrid", tokens_per_s=2000.0) for i in range(2)]
    bus = EventBus()
    replicas = ReplicaSet(standalone=standalone, hybrid=hybrid, events=bus)
    trainer = Trainer()
    loop = FullyAsyncLoop.build(
        CFG,
        NeverActivate(),
        trainer,
        prompts=(f"p{i}" for i in range(400)),
        replicas=replicas,
        queue=AsyncSampleQueue(capacity=8),
        events=bus,
        wait_timeout_s=wait_timeout_s,
        max_tokens=16,
    )
    loop.driver.options = DriverOptions(wait_timeout_s=wait_timeout_s, failover=failover)
    trainer.loop = loop
    return loop, trainer


def _kill_standalone_after(loop: FullyAsyncLoop, step: int) -> None:
    def on_event(event: Any) -> None:
        if type(event).__name__ == "TrainStepEvent" and event.step == step:
            for rid in loop.replicas.standalone_ids:
                replica = loop.replicas[rid]
                assert isinstance(replica, InMemoryReplica)
                replica.kill()
                loop.replicas.mark_dead(rid)

    loop.events.subscribe(on_event)


async def test_all_standalone_killed_while_hybrids_sleep_wakes_them_and_completes() -> None:
    loop, trainer = _build(failover=True)
    failovers: list[FailoverEvent] = []
    loop.events.subscribe(lambda e: failovers.append(e) if isinstance(e, FailoverEvent) else None)
    _kill_standalone_after(loop, 2)
    result = await asyncio.wait_for(loop.run(12), 60)
    assert result.steps == 12
    assert result.failovers >= 1 and failovers and failovers[0].ok
    first = failovers[0]
    assert first.reason == "routable set empty" and first.routable_before == ()
    assert set(first.woken) == {"h0", "h1"}
    # woken with the weights of the last sync (step 2 synced version 1), not a later one
    assert first.global_steps == 1
    for rid in ("h0", "h1"):
        replica = loop.replicas[rid]
        assert isinstance(replica, InMemoryReplica)
        # kept current afterwards (the last step's sync skips them: end of run)
        assert replica.weights_version >= result.final_version - 1
    # nothing lost or duplicated; the trainer never trained with a hybrid awake
    ids = result.consumed_sample_ids
    assert len(ids) == len(set(ids)) == 12 * CFG.required_samples
    assert result.samples_failed == 0
    assert result.samples_produced == result.samples_consumed + result.samples_left
    assert trainer.hybrid_awake_while_training == []
    # colocated-like mode after the loss: hybrids switched every cycle
    assert result.activations >= 1 and result.deactivations >= 1


async def test_without_failover_the_collection_times_out() -> None:
    loop, _ = _build(failover=False, wait_timeout_s=0.5)
    _kill_standalone_after(loop, 2)
    with pytest.raises(SampleWaitTimeoutError):
        await asyncio.wait_for(loop.run(12), 60)
    assert loop.driver.failovers == 0


async def test_failover_is_not_due_with_routable_replicas_or_enough_samples() -> None:
    loop, _ = _build(failover=True)
    await loop.replicas.route(loop.replicas.standalone_ids)
    assert loop.driver.failover_reason() is None  # two routable standalone replicas
    for rid in loop.replicas.standalone_ids:
        loop.replicas.mark_dead(rid)
    assert loop.driver.failover_reason() == "routable set empty"
    # the queue already holds what the wait needs: no switch
    for i in range(2):
        await loop.queue.put(i)
    async with loop.driver.trainer_waiting(2):
        pass
    assert loop.driver.failovers == 0 and not loop.controller.is_hybrid_active
    # short of samples: the hybrids are woken, and put back to sleep at the end
    async with loop.driver.trainer_waiting(4):
        assert loop.controller.is_hybrid_active
        assert loop.replicas.routable_ids == ["h0", "h1"]
    assert loop.driver.failovers == 1 and not loop.controller.is_hybrid_active
    state = loop.driver.state_dict()
    assert state["failovers"] == 1
    del state["failovers"]  # a checkpoint written before failovers existed still loads
    loop.driver.load_state_dict(state)
    assert loop.driver.failovers == 0


async def test_min_routable_replicas_fails_over_on_reduced_capacity() -> None:
    loop, _ = _build(failover=True)
    loop.driver.options = DriverOptions(wait_timeout_s=2.0, min_routable_replicas=2)
    await loop.replicas.route(loop.replicas.standalone_ids)
    assert loop.driver.failover_reason() is None
    loop.replicas.mark_dead("s0")
    assert loop.driver.failover_reason() == "1 routable < 2"
    event = await loop.driver.failover()
    assert event is not None and event.ok and event.routable_before == ("s1",)
    assert loop.replicas.routable_ids == ["h0", "h1", "s1"]


def test_driver_options_failover_fields_are_validated() -> None:
    with pytest.raises(ValueError, match="min_routable_replicas"):
        DriverOptions(min_routable_replicas=0)
    with pytest.raises(TypeError, match="failover"):
        DriverOptions(failover="yes")  # type: ignore[arg-type]
