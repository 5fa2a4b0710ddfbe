from __future__ import annotations

from dynsched_core import EventBus, RolloutEvent, SwitchEvent


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
