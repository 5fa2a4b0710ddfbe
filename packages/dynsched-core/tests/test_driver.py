"""ScheduleDriver: policy call order, context, waits, guard rails, checkpoints."""

from __future__ import annotations

import asyncio
import doctest
from typing import Any

import dynsched_core._driver as driver_module
import pytest
from dynsched_core import (
    AsyncSampleQueue,
    DriverOptions,
    DynamicResourceController,
    DynamicScheduleConfig,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    EventBus,
    GuardRailOverride,
    InMemoryReplica,
    ReplicaSet,
    ScheduleDriver,
    SwitchError,
)
from dynsched_core.events import GuardRailEvent
from dynsched_core.testing import CallRecorder


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


async def make(
    policy: DynamicSchedulePolicyBase,
    *,
    standalone: int = 1,
    hybrid: int = 2,
    capacity: int | None = None,
    wait_timeout_s: float = 5.0,
    on_switch_error: Any = "continue",
    events: EventBus | None = None,
    **cfg: Any,
) -> tuple[ScheduleDriver, AsyncSampleQueue, CallRecorder, dict[str, InMemoryReplica]]:
    rec = CallRecorder()
    hyb = {f"h{i}": InMemoryReplica(f"h{i}", role="hybrid", recorder=rec) for i in range(hybrid)}
    replicas = ReplicaSet(
        standalone=[InMemoryReplica(f"s{i}") for i in range(standalone)], hybrid=hyb
    )
    await replicas.route(replicas.standalone_ids)
    ctrl = DynamicResourceController(replicas)
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
        DriverOptions(wait_timeout_s=wait_timeout_s, on_switch_error=on_switch_error),
        events=events,
    )
    return driver, queue, rec, hyb


async def test_full_cycle_call_order_matches_design() -> None:
    policy = ScriptedPolicy(wait=2)
    driver, queue, rec, _ = await make(policy)
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
    driver, _, rec, _ = await make(policy)
    result = await driver.after_weight_sync(1, 1)
    assert not result.activated and result.hybrid_sync_skipped
    assert rec.calls == []  # no wake_up, no update_weights on hybrid replicas
    assert driver.skipped_hybrid_syncs == 1
    assert "request_rebalance" not in policy.names()
    assert policy.names()[-1] == "update_after_step"


async def test_rebalance_follows_config_and_policy() -> None:
    off = ScriptedPolicy()
    driver, _, _, _ = await make(off, dynamic_schedule_enable_rebalance=False)
    result = await driver.after_weight_sync(1, 1)
    assert result.activated and result.rebalance is None
    assert "request_rebalance" not in off.names()
    declined = ScriptedPolicy(rebalance=False)
    driver, _, _, _ = await make(declined)
    result = await driver.after_weight_sync(1, 1)
    assert result.rebalance is None and "request_rebalance" in declined.names()


async def test_wait_before_deactivation_returns_at_end_of_stream() -> None:
    policy = ScriptedPolicy(wait=50)
    driver, queue, _, _ = await make(policy)
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
    driver, _, _, _ = await make(policy, wait_timeout_s=0.02)
    await driver.after_weight_sync(0, 0)
    before = await driver.before_train_step(0)
    assert before.wait_timed_out and before.buffered == 0
    assert before.deactivated  # training goes on: deactivation happens anyway


async def test_wait_target_is_validated_and_clamped() -> None:
    # 4 samples per cycle: the default ratio range [0, 1] allows waits in [0, 4]
    driver, _, _, _ = await make(ScriptedPolicy(wait=100), capacity=3, wait_timeout_s=0.01)
    before = await driver.before_train_step(0)
    assert before.proposed_wait == 100 and before.wait_target == 3
    assert [o.rule for o in before.overrides] == ["ratio_range", "queue_capacity"]
    assert [(o.proposed, o.applied) for o in before.overrides] == [(100, 4), (4, 3)]
    bad, _, _, _ = await make(ScriptedPolicy(wait=-1))
    before = await bad.before_train_step(0)
    assert before.wait_target == 0 and before.overrides[0].rule == "ratio_range"
    worse, _, _, _ = await make(ScriptedPolicy(wait=1.5))
    with pytest.raises(TypeError, match="deactivate_wait_samples"):
        await worse.before_train_step(0)
    also, _, _, _ = await make(ScriptedPolicy(wait=True))
    with pytest.raises(TypeError, match="deactivate_wait_samples"):
        await also.before_train_step(0)


async def test_switch_durations_reach_the_next_context() -> None:
    policy = ScriptedPolicy()
    driver, _, _, hyb = await make(policy)
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
    driver, queue, rec, _ = await make(policy)
    result = await driver.after_weight_sync(5, 5, is_last_step=True)
    assert result.should_activate and result.forced and not result.activated
    # producer finished: no activation
    await queue.close()
    result = await driver.after_weight_sync(6, 6)
    assert not result.activated and result.context is not None
    assert result.context.producer_finished
    # hybrid-only: activation forced although the policy declines
    lazy = ScriptedPolicy(activate=False)
    driver, _, _, _ = await make(lazy, standalone=0)
    assert driver.only_hybrid
    result = await driver.after_weight_sync(1, 1)
    assert result.forced and result.activated
    assert rec.calls == []


async def test_disabled_scheduling_never_calls_the_policy() -> None:
    policy = ScriptedPolicy()
    driver, _, rec, _ = await make(policy, use_dynamic_resource_scheduling=False)
    await driver.before_train_step(0)
    await driver.after_weight_sync(1, 1)
    assert policy.calls == [] and rec.calls == []


async def test_switch_errors_continue_or_raise() -> None:
    policy = ScriptedPolicy()
    driver, _, _, hyb = await make(policy)
    hyb["h0"].fail_next("wake_up")
    result = await driver.after_weight_sync(1, 1)
    assert not result.activated and isinstance(result.error, SwitchError)
    assert result.error.step == "wake_up" and driver.switch_errors == 1
    assert policy.names()[-1] == "update_after_step"  # the cycle still completes
    strict = ScriptedPolicy()
    driver, _, _, hyb = await make(strict, on_switch_error="raise")
    hyb["h1"].fail_next("update_weights")
    with pytest.raises(SwitchError, match="update_weights"):
        await driver.after_weight_sync(1, 1)


async def test_state_dict_round_trip() -> None:
    policy = ScriptedPolicy()
    driver, _, _, _ = await make(policy)
    await driver.after_weight_sync(0, 0)
    await driver.before_train_step(0)
    driver.record_collection(1.0, 2)
    state = driver.state_dict()
    assert state["policy"] == {"learned": 1}
    fresh_policy = ScriptedPolicy()
    fresh, _, _, _ = await make(fresh_policy)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert fresh_policy.learned == 1
    ctx = await fresh.context(3)
    assert ctx.step_wait_samples == (2,) and ctx.expected_samples == 2
    with pytest.raises(ValueError, match="format"):
        fresh.load_state_dict({"format": 99})


async def test_record_collection_validation() -> None:
    driver, _, _, _ = await make(ScriptedPolicy())
    with pytest.raises(ValueError, match="wait_s"):
        driver.record_collection(-1.0, 0)
    with pytest.raises(ValueError, match="waited_samples"):
        driver.record_collection(0.0, -2)


def test_doctest() -> None:
    assert doctest.testmod(driver_module).failed == 0


class OutOfRange(DynamicSchedulePolicyBase):
    """A third-party policy that knows nothing of the guard rails."""

    def __init__(self, wait: int, activate: bool) -> None:
        self.wait, self.activate = wait, activate

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return True

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return self.wait

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return self.activate


async def test_third_party_out_of_range_decision_is_corrected_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = EventBus()
    seen: list[GuardRailEvent] = []
    events.subscribe(seen.append, GuardRailEvent)
    # 16 samples per cycle; the config's guard rails allow waits of [0.25 * 16, 0.5 * 16]
    driver, queue, _, _ = await make(
        OutOfRange(wait=15, activate=True),
        events=events,
        wait_timeout_s=0.01,
        ppo_mini_batch_size=8,
        dynamic_schedule_deactivate_ratio=0.3,
        dynamic_schedule_min_deactivate_ratio=0.25,
        dynamic_schedule_max_deactivate_ratio=0.5,
    )
    for i in range(10):
        await queue.put(i)
    await driver.after_weight_sync(0, 0)
    with caplog.at_level("WARNING", logger="dynsched_core._driver"):
        before = await driver.before_train_step(1)
    assert before.proposed_wait == 15 and before.wait_target == 8
    assert before.buffered == 10 and before.deactivated  # waited for 8, not 15
    (override,) = before.overrides
    assert override == GuardRailOverride(
        decision="deactivate_wait_samples",
        rule="ratio_range",
        proposed=15,
        applied=8,
        reason=override.reason,
    )
    assert "[4, 8]" in override.reason
    assert [e.override for e in seen] == [override] and seen[0].global_steps == 1
    assert driver.overrides == 1
    assert "guard rail 'ratio_range' corrected OutOfRange" in caplog.text
    # a wait below the range is raised to it
    low, queue, _, _ = await make(
        OutOfRange(wait=1, activate=True),
        ppo_mini_batch_size=8,
        dynamic_schedule_min_deactivate_ratio=0.25,
        dynamic_schedule_deactivate_ratio=0.3,
    )
    await low.after_weight_sync(0, 0)
    for i in range(4):
        await queue.put(i)
    before = await low.before_train_step(1)
    assert (before.proposed_wait, before.wait_target) == (1, 4)


async def test_activation_guard_rails_report_the_rule() -> None:
    driver, _, _, _ = await make(OutOfRange(wait=0, activate=True))
    result = await driver.after_weight_sync(5, 5, is_last_step=True)
    assert not result.activated and result.forced
    assert [(o.rule, o.proposed, o.applied) for o in result.overrides] == [
        ("end_of_run", True, False)
    ]
    colocated, queue, _, _ = await make(OutOfRange(wait=0, activate=False), standalone=0)
    result = await colocated.after_weight_sync(1, 1)
    assert result.activated
    assert [o.rule for o in result.overrides] == ["colocated"]
    # colocated: deactivation waits for the rest of the cycle (2 micro-steps x 2 samples)
    for i in range(4):
        await queue.put(i)
    before = await colocated.before_train_step(2)
    assert (before.proposed_wait, before.wait_target) == (0, 4)
    assert [o.rule for o in before.overrides] == ["colocated"]
    colocated.record_collection(0.0, 0)
    await queue.get(2)
    # the second micro-step of the cycle needs only its own samples
    await colocated.after_weight_sync(2, 2)
    await colocated.before_train_step(3)
    second = await colocated.before_train_step(4)
    assert second.wait_target == 2


async def test_colocated_follows_the_live_membership() -> None:
    driver, _, _, _ = await make(ScriptedPolicy(activate=False), standalone=1)
    assert not driver.only_hybrid
    driver.replicas.mark_dead("s0")  # the last standalone replica dies
    assert driver.only_hybrid and driver.num_standalone_replicas == 0
    result = await driver.after_weight_sync(1, 1)
    assert result.context is not None and result.context.only_hybrid
    assert result.activated and [o.rule for o in result.overrides] == ["colocated"]


def test_driver_options_are_validated() -> None:
    with pytest.raises(ValueError, match="DriverOptions.wait_timeout_s"):
        DriverOptions(wait_timeout_s=0.0)
    with pytest.raises(ValueError, match=r"DriverOptions.on_switch_error must be one of"):
        DriverOptions(on_switch_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dynamic_schedule_max_deactivate_ratio"):
        DynamicScheduleConfig(
            dynamic_schedule_min_deactivate_ratio=0.6, dynamic_schedule_max_deactivate_ratio=0.5
        )
    with pytest.raises(
        ValueError, match=r"dynamic_schedule_deactivate_ratio must be in \[0.4, 1\]"
    ):
        DynamicScheduleConfig(
            dynamic_schedule_deactivate_ratio=0.3, dynamic_schedule_min_deactivate_ratio=0.4
        )


def test_check_state_dict_matches_state_dict_and_names_the_key() -> None:
    """The shape check knows every key `state_dict` writes, and refuses bad values by key."""
    from dynsched_core import (
        AsyncSampleQueue,
        DynamicResourceController,
        DynamicScheduleConfig,
        ReplicaSet,
        ScheduleDriver,
    )
    from dynsched_core._driver import _OPTIONAL_STATE, _STATE_KEYS

    cfg = DynamicScheduleConfig(ppo_mini_batch_size=2, trigger_parameter_sync_step=1)
    driver = ScheduleDriver(
        cfg.build_policy(), DynamicResourceController(ReplicaSet()), AsyncSampleQueue(), cfg
    )
    state = driver.state_dict()
    assert set(state) == set(_STATE_KEYS)
    ScheduleDriver.check_state_dict(state)
    for key in sorted(set(state) - _OPTIONAL_STATE - {"format"}):
        partial = {k: v for k, v in state.items() if k != key}
        with pytest.raises(ValueError, match=key):
            ScheduleDriver.check_state_dict(partial)
    for key, bad in [("cycles", "3"), ("wait_times", [None]), ("policy", 1), ("failovers", 1.5)]:
        with pytest.raises(ValueError, match=key):
            ScheduleDriver.check_state_dict({**state, key: bad})
    with pytest.raises(ValueError, match="format"):
        ScheduleDriver.check_state_dict({**state, "format": None})
    with pytest.raises(ValueError, match="mapping"):
        ScheduleDriver.check_state_dict([1])
    ScheduleDriver.check_state_dict({k: v for k, v in state.items() if k != "failovers"})
