"""ScheduleDriver: policy call order, context, waits, guard rails, checkpoints."""

from __future__ import annotations

import asyncio
import doctest
from typing import Any

import dynsched_core._driver as driver_module
import pytest
from dynsched_core import (
    AsyncSampleQueue,
    DynamicResourceController,
    DynamicScheduleConfig,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    LoadBalancer,
    ScheduleDriver,
    SwitchError,
)
from dynsched_core.testing import CallRecorder, InMemoryReplica


class ScriptedPolicy(DynamicSchedulePolicyBase):
    """Records every call (name, global_steps, ctx) and answers from attributes."""

    def __init__(
        self,
        *,
        deactivate: bool = True,
        wait: Any = 0,
        activate: bool = True,
        rebalance: bool | None = None,
    ) -> None:
        self.deactivate, self.wait, self.activate, self.rebalance = (
            deactivate,
            wait,
            activate,
            rebalance,
        )
        self.calls: list[tuple[str, int | None, DynamicScheduleContext]] = []
        self.learned = 0

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        self.calls.append(("should_deactivate", global_steps, ctx))
        return self.deactivate

    def deactivate_wait_samples(self, ctx: Any) -> int:
        self.calls.append(("deactivate_wait_samples", None, ctx))
        return self.wait  # type: ignore[no-any-return]

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        self.calls.append(("should_activate_after_step", global_steps, ctx))
        return self.activate

    def request_rebalance(self, global_steps: int, ctx: Any) -> bool | None:
        self.calls.append(("request_rebalance", global_steps, ctx))
        return self.rebalance

    def update_after_step(self, global_steps: int, ctx: Any) -> None:
        self.calls.append(("update_after_step", global_steps, ctx))
        self.learned += 1

    def state_dict(self) -> dict[str, Any]:
        return {"learned": self.learned}

    def load_state_dict(self, state: Any) -> None:
        self.learned = state["learned"]

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def make(
    policy: DynamicSchedulePolicyBase,
    *,
    standalone: int = 1,
    hybrid: int = 2,
    capacity: int | None = None,
    wait_timeout_s: float = 5.0,
    **cfg: Any,
) -> tuple[ScheduleDriver, AsyncSampleQueue, CallRecorder, dict[str, InMemoryReplica]]:
    rec = CallRecorder()
    sids = [f"s{i}" for i in range(standalone)]
    router = LoadBalancer(sids)
    hyb = {f"h{i}": InMemoryReplica(f"h{i}", role="hybrid", recorder=rec) for i in range(hybrid)}
    ctrl = DynamicResourceController(router, hyb)
    queue = AsyncSampleQueue(capacity=capacity)
    config = DynamicScheduleConfig(
        **{
            "use_dynamic_resource_scheduling": True,
            "ppo_mini_batch_size": 2,
            "trigger_parameter_sync_step": 2,
            "staleness_threshold": 0.5,
            **cfg,
        }
    )
    driver = ScheduleDriver(
        policy,
        ctrl,
        queue,
        config,
        wait_timeout_s=wait_timeout_s,
        num_standalone_replicas=standalone,
    )
    return driver, queue, rec, hyb


async def test_full_cycle_call_order_matches_design() -> None:
    policy = ScriptedPolicy(wait=2)
    driver, queue, rec, _ = make(policy)
    after0 = await driver.after_weight_sync(0, 0)
    assert after0.activated
    for i in range(2):
        await queue.put(f"x{i}")
    before = await driver.before_train_step(0)
    assert before.deactivated and before.wait_target == 2 and before.buffered == 2
    driver.record_collection(0.5, 1)
    driver.record_collection(0.25, 0)
    await driver.before_train_step(0)  # hybrid already off
    after = await driver.after_weight_sync(1, 1)
    assert after.activated and after.rebalance is not None
    names = policy.names()
    assert names == [
        # start-up decision of the first cycle
        "should_activate_after_step",
        "request_rebalance",
        "update_after_step",
        # micro-step 1: deactivate after the wait
        "should_deactivate",
        "deactivate_wait_samples",
        # micro-step 2
        "should_deactivate",
        "deactivate_wait_samples",
        # weight sync
        "should_activate_after_step",
        "request_rebalance",
        "update_after_step",
    ]
    ctx_activate = policy.calls[-3][2]
    assert policy.calls[-1][2] is ctx_activate  # one context for both decisions
    assert ctx_activate.step_wait_times == (0.5, 0.25)
    assert ctx_activate.step_wait_samples == (1, 0)
    assert ctx_activate.expected_samples == 4  # two micro-steps of 2 samples asked for
    assert ctx_activate.total_generated_samples == 2
    assert ctx_activate.buffer_samples == 2  # 0.5 * 2 * 2
    assert ctx_activate.num_hybrid_replicas == 2 and ctx_activate.num_standalone_replicas == 1
    # the hybrid weight sync ran with the activation
    assert rec.methods("h0")[-3:] == ["wake_up", "update_weights", "resume"]


async def test_hybrid_weight_sync_skipped_when_not_activating() -> None:
    policy = ScriptedPolicy(activate=False)
    driver, _, rec, _ = make(policy)
    result = await driver.after_weight_sync(1, 1)
    assert not result.activated and result.hybrid_sync_skipped
    assert rec.calls == []  # no wake_up, no update_weights on hybrid replicas
    assert driver.skipped_hybrid_syncs == 1
    assert "request_rebalance" not in policy.names()
    assert policy.names()[-1] == "update_after_step"


async def test_rebalance_follows_config_and_policy() -> None:
    off = ScriptedPolicy()
    driver, _, _, _ = make(off, dynamic_schedule_enable_rebalance=False)
    result = await driver.after_weight_sync(1, 1)
    assert result.activated and result.rebalance is None
    assert "request_rebalance" not in off.names()
    declined = ScriptedPolicy(rebalance=False)
    driver, _, _, _ = make(declined)
    result = await driver.after_weight_sync(1, 1)
    assert result.rebalance is None and "request_rebalance" in declined.names()


async def test_wait_before_deactivation_returns_at_end_of_stream() -> None:
    policy = ScriptedPolicy(wait=50)
    driver, queue, _, _ = make(policy)
    await driver.after_weight_sync(0, 0)
    await queue.put("only-one")

    async def close_later() -> None:
        await asyncio.sleep(0.02)
        await queue.close()

    closer = asyncio.create_task(close_later())
    before = await asyncio.wait_for(driver.before_train_step(0), 2.0)
    await closer
    assert before.buffered == 1 and not before.wait_timed_out and before.deactivated


async def test_wait_before_deactivation_is_bounded_by_timeout() -> None:
    policy = ScriptedPolicy(wait=3)
    driver, _, _, _ = make(policy, wait_timeout_s=0.02)
    await driver.after_weight_sync(0, 0)
    before = await driver.before_train_step(0)
    assert before.wait_timed_out and before.buffered == 0
    assert before.deactivated  # training goes on: deactivation happens anyway


async def test_wait_target_is_validated_and_clamped() -> None:
    driver, _, _, _ = make(ScriptedPolicy(wait=100), capacity=4, wait_timeout_s=0.01)
    before = await driver.before_train_step(0)
    assert before.wait_target == 4
    bad, _, _, _ = make(ScriptedPolicy(wait=-1))
    with pytest.raises(ValueError, match="deactivate_wait_samples"):
        await bad.before_train_step(0)
    worse, _, _, _ = make(ScriptedPolicy(wait=1.5))
    with pytest.raises(TypeError, match="deactivate_wait_samples"):
        await worse.before_train_step(0)


async def test_switch_durations_reach_the_next_context() -> None:
    policy = ScriptedPolicy()
    driver, _, _, hyb = make(policy)
    for r in hyb.values():
        r.wake_delay_s = r.sleep_delay_s = 0.01
    await driver.after_weight_sync(0, 0)
    await driver.before_train_step(0)
    await driver.after_weight_sync(1, 1)
    ctx = policy.calls[-1][2]
    # the activation that opened the cycle and the deactivation inside it
    assert ctx.last_activate_duration_s >= 0.01
    assert ctx.last_deactivate_duration_s >= 0.01


async def test_guard_rails() -> None:
    # last step: no activation whatever the policy says
    policy = ScriptedPolicy(activate=True)
    driver, queue, rec, _ = make(policy)
    result = await driver.after_weight_sync(5, 5, is_last_step=True)
    assert result.should_activate and result.forced and not result.activated
    # producer finished: no activation
    await queue.close()
    result = await driver.after_weight_sync(6, 6)
    assert not result.activated and result.context is not None
    assert result.context.producer_finished
    # hybrid-only: activation forced although the policy declines
    lazy = ScriptedPolicy(activate=False)
    driver, _, _, _ = make(lazy, standalone=0)
    assert driver.only_hybrid
    result = await driver.after_weight_sync(1, 1)
    assert result.forced and result.activated
    assert rec.calls == []


async def test_disabled_scheduling_never_calls_the_policy() -> None:
    policy = ScriptedPolicy()
    driver, _, rec, _ = make(policy, use_dynamic_resource_scheduling=False)
    await driver.before_train_step(0)
    await driver.after_weight_sync(1, 1)
    assert policy.calls == [] and rec.calls == []


async def test_switch_errors_continue_or_raise() -> None:
    policy = ScriptedPolicy()
    driver, _, _, hyb = make(policy)
    hyb["h0"].fail_next("wake_up")
    result = await driver.after_weight_sync(1, 1)
    assert not result.activated and isinstance(result.error, SwitchError)
    assert result.error.step == "wake_up" and driver.switch_errors == 1
    assert policy.names()[-1] == "update_after_step"  # the cycle still completes
    strict = ScriptedPolicy()
    driver, _, _, hyb = make(strict)
    driver.on_switch_error = "raise"
    hyb["h1"].fail_next("update_weights")
    with pytest.raises(SwitchError, match="update_weights"):
        await driver.after_weight_sync(1, 1)


async def test_state_dict_round_trip() -> None:
    policy = ScriptedPolicy()
    driver, _, _, _ = make(policy)
    await driver.after_weight_sync(0, 0)
    await driver.before_train_step(0)
    driver.record_collection(1.0, 2)
    state = driver.state_dict()
    assert state["policy"] == {"learned": 1}
    fresh_policy = ScriptedPolicy()
    fresh, _, _, _ = make(fresh_policy)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert fresh_policy.learned == 1
    ctx = await fresh.context(3)
    assert ctx.step_wait_samples == (2,) and ctx.expected_samples == 2
    with pytest.raises(ValueError, match="format"):
        fresh.load_state_dict({"format": 99})


def test_record_collection_validation_and_doctest() -> None:
    driver, _, _, _ = make(ScriptedPolicy())
    with pytest.raises(ValueError, match="wait_s"):
        driver.record_collection(-1.0, 0)
    with pytest.raises(ValueError, match="waited_samples"):
        driver.record_collection(0.0, -2)
    assert doctest.testmod(driver_module).failed == 0
