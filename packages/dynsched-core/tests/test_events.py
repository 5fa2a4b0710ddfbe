from __future__ import annotations

from dynsched_core import EventBus
from dynsched_core.events import RolloutEvent, SwitchEvent


def test_bus_filters_by_type_and_unsubscribes() -> None:
    bus = EventBus()
    everything: list[object] = []
    rollouts: list[object] = []
    bus.subscribe(everything.append)
    unsub = bus.subscribe(rollouts.append, RolloutEvent)
    e1 = RolloutEvent(0.0, 1, 4, "submit")
    e2 = SwitchEvent("activate", 1.0, 3.5)
    bus.emit(e1)
    bus.emit(e2)
    assert everything == [e1, e2]
    assert rollouts == [e1]
    assert e2.duration_s == 2.5
    unsub()
    bus.emit(e1)
    assert rollouts == [e1]


def test_failing_subscriber_is_isolated() -> None:
    bus = EventBus()
    got: list[object] = []

    def bad(_: object) -> None:
        raise ValueError("x")

    bus.subscribe(bad)
    bus.subscribe(got.append)
    bus.emit("e")
    assert got == ["e"]


def test_typed_errors_survive_pickling() -> None:
    """Errors cross process boundaries (Ray actors) intact."""
    import pickle

    from dynsched_core import ConfigError, HybridState, SwitchError
    from dynsched_core.errors import (
        IllegalTransitionError,
        RequestFailedError,
        SampleWaitTimeoutError,
    )

    errors = [
        ConfigError("bad key", key="a.b"),
        IllegalTransitionError(HybridState.STANDALONE_ONLY, HybridState.DEACTIVATING),
        SwitchError("activate", "wake_up", "h0", RuntimeError("x")),
        RequestFailedError("r1", 3, None),
        SampleWaitTimeoutError(4, 1, 2.5),
    ]
    for err in errors:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert str(back) == str(err)
        assert back.__dict__.keys() == err.__dict__.keys()
