"""The optional hooks that widen the decision space: mid-cycle activation, partial lending
(k of m), events for the policy; their defaults reproduce the published behaviour."""

from __future__ import annotations

from typing import Any

import pytest
from dynsched_core import (
    AsyncSampleQueue,
    DriverOptions,
    DynamicResourceController,
    DynamicScheduleConfig,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    EventBus,
    InMemoryReplica,
    ReplicaSet,
    ScheduleDriver,
)
from dynsched_core.events import SwitchEvent, TransitionEvent


class Lender(DynamicSchedulePolicyBase):
    """Lends ``k`` hybrid replicas mid-cycle (or after a sync) and deactivates after ``wait``."""

    def __init__(
        self, *, mid: bool = True, after: bool = False, k: Any = None, wait: int = 0
    ) -> None:
        self.mid, self.after, self.k, self.wait = mid, after, k, wait
        self.mid_calls: list[DynamicScheduleContext] = []
        self.k_calls: list[DynamicScheduleContext] = []
        self.events: list[Any] = []

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return self.wait

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return self.after

    def should_activate_mid_cycle(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        self.mid_calls.append(ctx)
        return self.mid

    def hybrid_replicas_to_activate(self, global_steps: int, ctx: DynamicScheduleContext) -> Any:
        self.k_calls.append(ctx)
        return self.k

    def observe(self, event: Any) -> None:
        self.events.append(event)


class Published(DynamicSchedulePolicyBase):
    """Only the published hooks (as verl's source): always lend after a sync."""

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return True


async def make(
    policy: DynamicSchedulePolicyBase, *, hybrid: int = 3, events: EventBus | None = None
) -> tuple[ScheduleDriver, AsyncSampleQueue, dict[str, InMemoryReplica]]:
    hyb = {f"h{i}": InMemoryReplica(f"h{i}", role="hybrid") for i in range(hybrid)}
    replicas = ReplicaSet(standalone=[InMemoryReplica("s0")], hybrid=hyb)
    await replicas.route(["s0"])
    ctrl = DynamicResourceController(replicas, events=events)
    queue = AsyncSampleQueue()
    config = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True,
        ppo_mini_batch_size=2,
        trigger_parameter_sync_step=2,
        staleness_threshold=0.5,
    )
    driver = ScheduleDriver(
        policy, ctrl, queue, config, DriverOptions(wait_timeout_s=5.0), events=events
    )
    return driver, queue, hyb


def test_base_class_defaults_are_the_published_behaviour() -> None:
    policy = Published()
    ctx = DynamicScheduleContext(required_samples=2)
    assert policy.should_activate_mid_cycle(1, False, ctx) is False
    assert policy.hybrid_replicas_to_activate(1, ctx) is None
    assert policy.observe(object()) is None


async def test_published_policy_lends_every_hybrid_and_never_mid_cycle() -> None:
    driver, _, _ = await make(Published())
    before = await driver.before_train_step(0)
    assert not before.activated_mid_cycle and not driver.controller.is_hybrid_active
    after = await driver.after_weight_sync(1, 1)
    assert after.activated
    assert driver.controller.active_hybrid_ids == ("h0", "h1", "h2")
    assert sorted(await driver.replicas.router.routable()) == ["h0", "h1", "h2", "s0"]
    assert driver.mid_cycle_activations == 0


async def test_mid_cycle_activation_loads_current_weights_then_deactivates() -> None:
    policy = Lender(wait=1)
    driver, queue, hyb = await make(policy)
    await driver.after_weight_sync(2, 2, weights="w2")  # not lent after the sync
    assert not driver.controller.is_hybrid_active
    await queue.put("x0")
    before = await driver.before_train_step(2)
    assert before.activated_mid_cycle and before.mid_cycle_activate_s >= 0
    assert before.deactivated and before.wait_target == 1
    assert driver.mid_cycle_activations == 1 and driver.activations == 1
    for replica in hyb.values():  # every hybrid loaded version 2 (the current one)
        assert replica.weights_version == 2 and replica.is_asleep
    # the context the policy saw mid-cycle: nothing lent, first step of the cycle
    assert policy.mid_calls[0].num_active_hybrid_replicas == 0
    assert policy.mid_calls[0].cycle_step == 1
    # should_deactivate was asked with the replicas lent
    assert before.context is not None and before.context.num_active_hybrid_replicas == 3


async def test_partial_lending_routes_only_the_chosen_replicas() -> None:
    policy = Lender(mid=False, after=True, k=2)
    driver, _, hyb = await make(policy)
    after = await driver.after_weight_sync(1, 1)
    assert after.activated
    assert driver.controller.active_hybrid_ids == ("h0", "h1")
    assert sorted(await driver.replicas.router.routable()) == ["h0", "h1", "s0"]
    assert hyb["h2"].is_asleep and not hyb["h0"].is_asleep
    assert await driver.controller.reconcile() == []  # the unlent replica stays out
    ctx = await driver.context(1)
    assert ctx.num_active_hybrid_replicas == 2 and ctx.num_hybrid_replicas == 3
    before = await driver.before_train_step(1)
    assert before.deactivated
    assert all(r.is_asleep for r in hyb.values())
    assert await driver.replicas.router.routable() == ["s0"]


async def test_reconcile_takes_an_unlent_hybrid_out_of_routing() -> None:
    driver, _, _ = await make(Lender(mid=False, after=True, k=1))
    await driver.after_weight_sync(1, 1)
    await driver.replicas.route(["h2"])  # routed behind the controller's back
    assert await driver.controller.reconcile() == ["h2"]
    assert sorted(await driver.replicas.router.routable()) == ["h0", "s0"]


async def test_partial_lending_survives_the_death_of_a_lent_replica() -> None:
    driver, _, _ = await make(Lender(mid=False, after=True, k=1))
    await driver.after_weight_sync(1, 1)
    driver.replicas.mark_dead("h0")
    await driver.replicas.settle()
    assert driver.controller.active_hybrid_ids == ()
    assert not driver.controller.is_hybrid_active  # never claims capacity that is gone


@pytest.mark.parametrize(("k", "lent"), [(0, 1), (-3, 1), (1, 1), (3, 3), (7, 3)])
async def test_k_is_bounded_to_one_through_m(k: int, lent: int) -> None:
    driver, _, _ = await make(Lender(mid=False, after=True, k=k))
    await driver.after_weight_sync(1, 1)
    assert len(driver.controller.active_hybrid_ids) == lent


@pytest.mark.parametrize("k", [1.5, "2", True])
async def test_k_of_a_wrong_type_is_refused(k: Any) -> None:
    driver, _, _ = await make(Lender(mid=False, after=True, k=k))
    with pytest.raises(TypeError, match="hybrid_replicas_to_activate must return an int"):
        await driver.after_weight_sync(1, 1)


async def test_no_mid_cycle_activation_on_the_last_step_or_when_colocated() -> None:
    policy = Lender()
    driver, _, _ = await make(policy)
    before = await driver.before_train_step(0, is_last_step=True)
    assert not before.activated_mid_cycle and policy.mid_calls == []


async def test_controller_refuses_unknown_replica_ids() -> None:
    driver, _, _ = await make(Published())
    with pytest.raises(ValueError, match="live hybrid replicas"):
        await driver.controller.activate(1, replica_ids=["nope"])
    with pytest.raises(ValueError, match="live hybrid replicas"):
        await driver.controller.activate(1, replica_ids=[])
    assert not driver.controller.is_hybrid_active


async def test_observe_receives_the_bus_events() -> None:
    bus = EventBus()
    policy = Lender(mid=False, after=True)
    driver, _, _ = await make(policy, events=bus)
    await driver.after_weight_sync(1, 1)
    await driver.before_train_step(1)
    kinds = [e.kind for e in policy.events if isinstance(e, SwitchEvent)]
    assert kinds == ["activate", "rebalance", "deactivate"] or kinds == ["activate", "deactivate"]
    assert any(isinstance(e, TransitionEvent) for e in policy.events)


async def test_a_policy_without_observe_is_not_subscribed() -> None:
    bus = EventBus()
    await make(Published(), events=bus)
    assert bus._subs == []


class _Trainer:
    async def train_step(self, samples: Any) -> dict[str, float]:
        return {"update_actor": 0.0}

    async def sync_weights(self, version: int) -> None:
        return None


async def test_reference_loop_with_partial_mid_cycle_lends_keeps_every_sample_once() -> None:
    from dynsched_core import FullyAsyncLoop

    class PartialMidCycle(Lender):
        def __init__(self) -> None:
            super().__init__(mid=True, after=False, k=1, wait=2)
            self.lent: list[int] = []

        def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
            if is_hybrid_active:
                self.lent.append(ctx.num_active_hybrid_replicas)
            return is_hybrid_active

    policy = PartialMidCycle()
    config = DynamicScheduleConfig(
        use_dynamic_resource_scheduling=True,
        ppo_mini_batch_size=2,
        trigger_parameter_sync_step=2,
        staleness_threshold=0.5,
    )
    loop = FullyAsyncLoop.build(
        config,
        policy,
        _Trainer(),
        prompts=range(40),
        standalone=[InMemoryReplica("s0", tokens_per_s=2e4)],
        hybrid=[InMemoryReplica(f"h{i}", role="hybrid", tokens_per_s=2e4) for i in range(2)],
        max_tokens=16,
        wait_timeout_s=30.0,
    )
    result = await loop.run(6)
    assert result.steps == 6 and result.samples_failed == 0
    assert result.samples_produced == result.samples_consumed + result.samples_left
    ids = result.consumed_sample_ids
    assert len(ids) == len(set(ids)) == 6 * config.required_samples
    assert loop.driver.mid_cycle_activations >= 1
    assert set(policy.lent) == {1}
    assert loop.controller.active_hybrid_ids == ()
