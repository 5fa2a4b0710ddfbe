from __future__ import annotations

import itertools
import logging

import pytest
from dynsched_core import HybridState
from dynsched_core._clock import ManualClock
from dynsched_core._state import LEGAL_TRANSITIONS, HybridStateMachine, Transition
from dynsched_core.errors import IllegalTransitionError


def test_legal_cycle_and_listeners() -> None:
    clock = ManualClock()
    sm = HybridStateMachine(clock=clock)
    seen: list[Transition] = []
    sm.add_listener(seen.append)
    assert sm.state is HybridState.STANDALONE_ONLY
    for target in (
        HybridState.ACTIVATING,
        HybridState.HYBRID_ACTIVE,
        HybridState.DEACTIVATING,
        HybridState.STANDALONE_ONLY,
    ):
        clock.advance(1.0)
        sm.transition(target, reason="test")
    assert [(t.source, t.target) for t in seen] == [
        (HybridState.STANDALONE_ONLY, HybridState.ACTIVATING),
        (HybridState.ACTIVATING, HybridState.HYBRID_ACTIVE),
        (HybridState.HYBRID_ACTIVE, HybridState.DEACTIVATING),
        (HybridState.DEACTIVATING, HybridState.STANDALONE_ONLY),
    ]
    assert [t.time for t in seen] == [1.0, 2.0, 3.0, 4.0]
    assert sm.history == seen


@pytest.mark.parametrize(("source", "target"), list(itertools.product(HybridState, HybridState)))
def test_every_pair_is_checked(source: HybridState, target: HybridState) -> None:
    sm = HybridStateMachine(clock=ManualClock(), initial=source)
    if (source, target) in LEGAL_TRANSITIONS:
        sm.transition(target)
        assert sm.state is target
    else:
        with pytest.raises(IllegalTransitionError):
            sm.transition(target)
        assert sm.state is source


def test_failed_activation_can_fall_back() -> None:
    sm = HybridStateMachine(clock=ManualClock())
    sm.transition(HybridState.ACTIVATING)
    sm.transition(HybridState.STANDALONE_ONLY, reason="wake_up failed")
    assert not sm.is_hybrid_active


def test_listener_failure_does_not_break_transition(caplog: pytest.LogCaptureFixture) -> None:
    sm = HybridStateMachine(clock=ManualClock())
    calls: list[HybridState] = []

    def bad(_: Transition) -> None:
        raise RuntimeError("boom")

    sm.add_listener(bad)
    sm.add_listener(lambda t: calls.append(t.target))
    with caplog.at_level(logging.ERROR):
        sm.transition(HybridState.ACTIVATING)
    assert calls == [HybridState.ACTIVATING]
    assert "boom" in caplog.text
    sm.remove_listener(bad)
    sm.transition(HybridState.HYBRID_ACTIVE)
    assert sm.is_hybrid_active
