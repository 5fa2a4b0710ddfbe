"""`DriverCore`: the driver's decisions as a pure step, driven directly (events in,
actions out), as h11's connection is tested: no loop, no controller, no queue."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from dynsched_core import DynamicScheduleConfig, DynamicSchedulePolicyBase, GuardRails
from dynsched_core._decide import (
    Ack,
    Activate,
    AfterSync,
    AfterSyncResult,
    BeforeStep,
    BeforeStepResult,
    Deactivate,
    Done,
    DriverCore,
    DriverState,
    InitialActivation,
    Observation,
    Observe,
    Rebalance,
    ReportOverrides,
    Switched,
    Waited,
    WaitForSamples,
    check_driver_state,
)
from dynsched_core._errors import SwitchError
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule


class Scripted(DynamicSchedulePolicyBase):
    """Answers what the test sets; records every call."""

    def __init__(self) -> None:
        self.deactivate = True
        self.wait = 3
        self.activate = True
        self.rebalance: bool | None = None
        self.calls: list[str] = []

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        self.calls.append("should_deactivate")
        return self.deactivate

    def deactivate_wait_samples(self, ctx: Any) -> int:
        self.calls.append("deactivate_wait_samples")
        return self.wait

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        self.calls.append("should_activate_after_step")
        return self.activate

    def request_rebalance(self, global_steps: int, ctx: Any) -> bool | None:
        self.calls.append("request_rebalance")
        return self.rebalance

    def update_after_step(self, global_steps: int, ctx: Any) -> None:
        self.calls.append("update_after_step")


def config(**changes: Any) -> DynamicScheduleConfig:
    base: dict[str, Any] = dict(
        use_dynamic_resource_scheduling=True, ppo_mini_batch_size=4, trigger_parameter_sync_step=2
    )
    base.update(changes)
    return DynamicScheduleConfig(**base)


def obs(**changes: Any) -> Observation:
    base: dict[str, Any] = dict(
        produced=10,
        queue_size=2,
        now=5.0,
        num_standalone=1,
        hybrid_ids=("h0", "h1"),
        hybrid_nodes=("n0", "n1"),
    )
    base.update(changes)
    return Observation(**base)


def test_before_step_events_in_actions_out() -> None:
    policy = Scripted()
    core = DriverCore(policy, config())
    assert core.step(BeforeStep(global_steps=1)) == Observe()
    assert core.step(obs(is_hybrid_active=True, active_hybrid=2)) == WaitForSamples(target=3)
    assert policy.calls == ["should_deactivate", "deactivate_wait_samples"]
    assert core.step(Waited(buffered=3, started=5.0, ended=6.5)) == Deactivate()
    done = core.step(Switched(value=True, started=6.5, ended=7.0))
    assert isinstance(done, Done) and isinstance(done.result, BeforeStepResult)
    r = done.result
    assert (r.wait_target, r.buffered, r.wait_s, r.deactivated, r.deactivate_s) == (
        3,
        3,
        1.5,
        True,
        0.5,
    )
    assert core.state.deactivations == 1 and core.state.cycle_deactivate_s == 0.5
    assert core.state.requested_samples == 4 and not core.busy


def test_wait_outside_the_range_is_reported_then_bounded() -> None:
    policy = Scripted()
    policy.wait = 100
    core = DriverCore(policy, config(dynamic_schedule_max_deactivate_ratio=0.5))
    core.step(BeforeStep(global_steps=1))
    report = core.step(obs(is_hybrid_active=True))
    assert isinstance(report, ReportOverrides) and report.overrides[0].rule == "ratio_range"
    assert core.step(Ack()) == WaitForSamples(target=4)  # floor(0.5 * 8)


def test_after_sync_activates_rebalances_and_times_from_the_outcomes() -> None:
    policy = Scripted()
    core = DriverCore(policy, config())
    assert core.step(AfterSync(global_steps=2, version=3)) == Observe()
    assert core.step(obs()) == Activate(version=3, replica_ids=None)
    assert core.step(Switched(value=True, started=1.0, ended=3.0, is_hybrid_active=True)) == (
        Rebalance()
    )
    done = core.step(Switched(value=None, started=3.0, ended=3.25, is_hybrid_active=True))
    assert isinstance(done, Done) and isinstance(done.result, AfterSyncResult)
    assert done.result.activated and done.result.activate_s == 2.25
    assert policy.calls == ["should_activate_after_step", "request_rebalance", "update_after_step"]
    assert core.state.cycles == 1 and core.state.cycle_activate_s == 2.25
    assert core.state.param_version == 3


def test_no_activation_skips_the_hybrid_sync_and_a_failed_switch_is_reported() -> None:
    policy = Scripted()
    policy.activate = False
    core = DriverCore(policy, config())
    core.step(AfterSync(global_steps=2, version=1))
    done = core.step(obs())
    assert isinstance(done, Done) and done.result.hybrid_sync_skipped
    assert core.state.skipped_hybrid_syncs == 1
    policy.activate = True
    core.step(AfterSync(global_steps=4, version=2))
    core.step(obs())
    error = SwitchError("boom", step="wake_up")
    done = core.step(Switched(value=False, error=error))
    assert isinstance(done, Done) and not done.result.activated and done.result.error is error
    assert core.state.activations == 0


def test_end_of_run_and_colocated_rails_apply_to_every_policy() -> None:
    policy = Scripted()
    core = DriverCore(policy, config())
    core.step(AfterSync(global_steps=2, version=1, is_last_step=True))
    report = core.step(obs())
    assert isinstance(report, ReportOverrides) and report.overrides[0].rule == "end_of_run"
    done = core.step(Ack())
    assert isinstance(done, Done) and not done.result.activated
    policy.activate = False
    core.step(InitialActivation(version=0))
    report = core.step(obs(num_standalone=0))
    assert isinstance(report, ReportOverrides) and report.overrides[0].rule == "colocated"
    assert core.step(Ack()) == Activate(version=0, replica_ids=None)


def test_outcome_without_a_sequence_is_refused() -> None:
    core = DriverCore(Scripted(), config())
    with pytest.raises(RuntimeError, match="no sequence running"):
        core.step(Ack())
    with pytest.raises(TypeError, match="Observation"):
        core.step(BeforeStep(global_steps=1))
        core.step(Ack())


def test_disabled_scheduling_never_calls_the_policy() -> None:
    policy = Scripted()
    core = DriverCore(policy, config(use_dynamic_resource_scheduling=False))
    assert isinstance(core.step(BeforeStep(global_steps=1)), Done)
    assert isinstance(core.step(AfterSync(global_steps=1, version=1)), Done)
    assert policy.calls == [] and core.state.cycles == 1


class CoreMachine(RuleBasedStateMachine):
    """Arbitrary sequences of steps, syncs, collections and switch failures, performed on a
    small model; the core's actions must respect the guard rails and the call order."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = Scripted()
        self.cfg = config(dynamic_schedule_min_deactivate_ratio=0.25)
        self.rails = GuardRails.from_config(self.cfg)
        self.core = DriverCore(self.policy, self.cfg)
        self.active = False
        self.standalone = 1
        self.queue = 0
        self.fail_next = False
        self.steps = self.syncs = self.ok_activations = self.ok_deactivations = 0
        self.g = 0

    def perform(self, action: Any, *, last: bool, after_sync: bool) -> Any:
        if isinstance(action, Observe):
            return obs(
                queue_size=self.queue,
                num_standalone=self.standalone,
                is_hybrid_active=self.active,
                active_hybrid=2 if self.active else 0,
            )
        if isinstance(action, ReportOverrides):
            return Ack()
        if isinstance(action, WaitForSamples):
            low, high = self.rails.wait_range(self.cfg.step_required_samples)
            if self.standalone:  # not colocated: the wait stays in the configured range
                assert low <= action.target <= high, action
            self.queue = max(self.queue, action.target)
            return Waited(buffered=self.queue)
        if isinstance(action, Activate):
            assert after_sync or not self.active
            assert not (last and after_sync), "activated on the last step"
            return self.switch(True)
        if isinstance(action, Deactivate):
            return self.switch(False)
        assert isinstance(action, Rebalance)
        assert self.active, "rebalance without an active hybrid pool"
        return Switched(value=None, is_hybrid_active=True, active_hybrid=2)

    def switch(self, to: bool) -> Switched:
        if self.fail_next:
            self.fail_next = False
            self.active = False
            return Switched(value=False, error=SwitchError("x", step="wake_up"))
        changed = self.active != to
        self.active = to
        if to:
            self.ok_activations += 1
        elif changed:
            self.ok_deactivations += 1
        return Switched(value=changed or to, is_hybrid_active=to, active_hybrid=2 if to else 0)

    def run(self, command: Any, *, last: bool, after_sync: bool) -> Any:
        action = self.core.step(command)
        while not isinstance(action, Done):
            action = self.core.step(self.perform(action, last=last, after_sync=after_sync))
        return action.result

    @rule(deactivate=st.booleans(), wait=st.integers(-5, 50), last=st.booleans())
    def before_step(self, deactivate: bool, wait: int, last: bool) -> None:
        self.policy.deactivate, self.policy.wait = deactivate, wait
        self.g += 1
        result = self.run(
            BeforeStep(global_steps=self.g, is_last_step=last), last=last, after_sync=False
        )
        self.steps += 1
        assert result.should_deactivate == deactivate
        self.queue = max(0, self.queue - self.cfg.required_samples)

    @rule(
        activate=st.booleans(), rebalance=st.sampled_from([None, True, False]), last=st.booleans()
    )
    def after_sync(self, activate: bool, rebalance: bool | None, last: bool) -> None:
        self.policy.activate, self.policy.rebalance = activate, rebalance
        self.policy.calls.clear()
        result = self.run(
            AfterSync(global_steps=self.g, version=self.syncs + 1, is_last_step=last),
            last=last,
            after_sync=True,
        )
        self.syncs += 1
        assert self.policy.calls[0] == "should_activate_after_step"
        assert self.policy.calls[-1] == "update_after_step"
        assert ("request_rebalance" in self.policy.calls) <= result.activated or (
            result.error is not None
        )
        if self.standalone == 0 and not last:
            assert result.activated or result.error is not None

    @rule(wait_s=st.floats(0, 10), waited=st.integers(0, 8))
    def collect(self, wait_s: float, waited: int) -> None:
        self.core.record_collection(wait_s, waited)

    @rule(n=st.integers(0, 2))
    def membership(self, n: int) -> None:
        self.standalone = n

    @precondition(lambda self: not self.fail_next)
    @rule()
    def break_next_switch(self) -> None:
        self.fail_next = True

    @invariant()
    def counters_follow_the_outcomes(self) -> None:
        st_ = self.core.state
        assert not self.core.busy
        assert st_.requested_samples == self.steps * self.cfg.required_samples
        assert st_.cycles == self.syncs
        assert st_.activations == self.ok_activations
        assert st_.deactivations == self.ok_deactivations
        assert len(st_.wait_times) == len(st_.wait_samples)
        assert st_.cycle_activate_s >= 0 and st_.cycle_deactivate_s >= 0


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


_CHECKPOINTED_STATE = st.builds(
    DriverState,
    # every int counter of the record (the mid-cycle count is not checkpointed)
    **{f.name: st.integers(0, 10**6) for f in attrs.fields(DriverState) if f.type == "int"},
    wait_times=st.lists(st.floats(0.0, 1e6), max_size=4),
    wait_samples=st.lists(st.integers(0, 10**6), max_size=4),
    cycle_activate_s=st.floats(0.0, 1e6),
    cycle_deactivate_s=st.floats(0.0, 1e6),
)


@given(_CHECKPOINTED_STATE)
def test_checkpoint_round_trip_restores_every_saved_field(state: DriverState) -> None:
    saved = DriverCore(Scripted(), config(), state).state_dict()
    assert list(saved)[:2] == ["format", "policy"]
    restored = DriverCore(Scripted(), config())
    restored.load_state_dict(saved)
    assert restored.state == attrs.evolve(state, mid_cycle_activations=0)
    assert restored.state.wait_times is not state.wait_times  # copied, not shared


@pytest.mark.parametrize(
    ("key", "bad", "wanted"),
    [
        ("cycles", 1.0, "an int"),
        ("failovers", True, "an int"),
        ("cycle_activate_s", "1", "a number"),
        ("wait_times", [1.0, None], "a list of numbers"),
        ("wait_samples", [1.5], "a list of numbers"),
    ],
)
def test_a_malformed_saved_field_is_named(key: str, bad: Any, wanted: str) -> None:
    saved = DriverCore(Scripted(), config()).state_dict()
    saved[key] = bad
    with pytest.raises(ValueError, match=rf"^ScheduleDriver state key '{key}' must be {wanted}$"):
        check_driver_state(saved)


def test_a_checkpoint_without_failovers_loads_as_zero() -> None:
    core = DriverCore(Scripted(), config(), DriverState(failovers=5))
    saved = core.state_dict()
    del saved["failovers"]
    core.load_state_dict(saved)
    assert core.state.failovers == 0
