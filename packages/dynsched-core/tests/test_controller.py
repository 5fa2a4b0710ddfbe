"""DynamicResourceController: call order, failures, idempotence, rebalance, events."""

from __future__ import annotations

import asyncio
import doctest
from typing import Any

import dynsched_core._controller as controller_module
import pytest
from dynsched_core import (
    ControllerOptions,
    DynamicResourceController,
    EventBus,
    GenerateRequest,
    HybridState,
    InMemoryReplicaOptions,
    LoadBalancer,
    ReplicaSet,
    RetryingClient,
    SwitchError,
)
from dynsched_core._state import LEGAL_TRANSITIONS
from dynsched_core.events import SwitchEvent, TransitionEvent
from dynsched_core.testing import CallRecorder, InMemoryReplica, RecordingRouter

HYBRID = ("h0", "h1")
STANDALONE = ("s0", "s1")


class FailingRouter(RecordingRouter):
    """RecordingRouter whose next add/remove can be made to raise once."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fail: set[str] = set()

    async def add_replicas(self, replica_ids):  # type: ignore[no-untyped-def]
        if "add_replicas" in self.fail:
            self.fail.discard("add_replicas")
            raise RuntimeError("injected add failure")
        await super().add_replicas(replica_ids)

    async def remove_replicas(self, replica_ids):  # type: ignore[no-untyped-def]
        if "remove_replicas" in self.fail:
            self.fail.discard("remove_replicas")
            raise RuntimeError("injected remove failure")
        await super().remove_replicas(replica_ids)


async def make(
    *, n_hybrid: int = 2, delays: float = 0.0, events: EventBus | None = None
) -> tuple[DynamicResourceController, FailingRouter, dict[str, InMemoryReplica], CallRecorder]:
    rec = CallRecorder()
    router = FailingRouter(LoadBalancer(), recorder=rec, record_leases=False)
    replicas: dict[str, InMemoryReplica] = {
        sid: InMemoryReplica(sid, recorder=rec, tokens_per_s=500.0) for sid in STANDALONE
    }
    for hid in HYBRID[:n_hybrid]:
        replicas[hid] = InMemoryReplica(
            hid,
            role="hybrid",
            recorder=rec,
            tokens_per_s=500.0,
            options=InMemoryReplicaOptions(
                wake_delay_s=delays,
                sleep_delay_s=delays,
                update_delay_s=delays,
                resume_delay_s=delays,
            ),
        )
    rs = ReplicaSet(
        router,
        standalone=[replicas[s] for s in STANDALONE],
        hybrid=[replicas[h] for h in HYBRID[:n_hybrid]],
    )
    await rs.route(list(STANDALONE))
    rec.clear()
    ctrl = DynamicResourceController(rs, ControllerOptions(call_timeout_s=5.0), events=events)
    return ctrl, router, replicas, rec


def phases(rec: CallRecorder, skip: tuple[str, ...] = ("generate",)) -> list[str]:
    """Collapse consecutive calls of one method into one phase name."""
    out: list[str] = []
    for call in rec.calls:
        if call.method in skip:
            continue
        if not out or out[-1] != call.method:
            out.append(call.method)
    return out


async def test_activation_call_order_and_state() -> None:
    ctrl, router, replicas, rec = await make()
    assert await ctrl.activate(3, weights="w", rebalance=True) is True
    assert phases(rec) == ["wake_up", "update_weights", "resume", "add_replicas", "clear_sticky"]
    assert [c.args for c in rec.filter(method="update_weights")] == [(3,), (3,)]
    assert {c.who for c in rec.filter(method="wake_up")} == set(HYBRID)
    assert ctrl.state is HybridState.HYBRID_ACTIVE and ctrl.is_hybrid_active
    assert await router.routable() == sorted(STANDALONE + HYBRID)
    assert all(replicas[h].is_accepting and replicas[h].weights_version == 3 for h in HYBRID)
    assert ctrl.activate_count == 1 and ctrl.hybrid_weights_version == 3


async def test_deactivation_call_order() -> None:
    ctrl, router, replicas, rec = await make()
    await ctrl.activate(1)
    rec.clear()
    assert await ctrl.deactivate() is True
    assert phases(rec) == ["remove_replicas", "abort", "sleep"]
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await router.routable() == sorted(STANDALONE)
    assert all(replicas[h].is_asleep for h in HYBRID)
    assert ctrl.deactivate_count == 1


async def test_deactivation_aborts_in_flight_and_client_resumes_on_standalone() -> None:
    ctrl, _router, replicas, _ = await make()
    await ctrl.activate(1)
    client = RetryingClient(ctrl.replicas)
    # Four requests fill the routers least-loaded: two land on the hybrid replicas.
    reqs = [GenerateRequest(request_id=f"r{i}", max_tokens=256) for i in range(4)]
    tasks = [asyncio.create_task(client.generate(r)) for r in reqs]
    await asyncio.sleep(0.01)
    assert any(replicas[h].running for h in HYBRID)
    await ctrl.deactivate()
    outcomes = await asyncio.gather(*tasks)
    for out in outcomes:
        assert out.num_tokens == 256 and list(out.output_tokens) == list(range(256))
    resumed = [o for o in outcomes if o.aborts]
    assert resumed, "requests on hybrid replicas must have been aborted and resumed"
    for o in resumed:
        assert o.replica_ids[-1] in STANDALONE


async def test_idempotence_and_noop_without_hybrid() -> None:
    ctrl, _, _, rec = await make()
    assert await ctrl.deactivate() is False  # already STANDALONE_ONLY
    assert rec.calls == []
    await ctrl.activate(2)
    rec.clear()
    assert await ctrl.activate(2) is False  # already active with these weights
    assert rec.calls == []
    assert await ctrl.deactivate() is True
    assert await ctrl.deactivate() is False
    assert ctrl.deactivate_count == 1

    empty, _, _, rec2 = await make(n_hybrid=0)
    assert not empty.has_hybrid_replicas
    assert await empty.activate(1) is False
    assert await empty.deactivate() is False
    assert empty.state is HybridState.STANDALONE_ONLY
    assert rec2.calls == []


async def test_activate_when_active_with_new_version_refreshes_weights() -> None:
    ctrl, router, replicas, rec = await make()
    await ctrl.activate(1)
    rec.clear()
    assert await ctrl.activate(2) is True
    assert phases(rec) == ["remove_replicas", "abort", "update_weights", "resume", "add_replicas"]
    assert ctrl.is_hybrid_active and all(replicas[h].weights_version == 2 for h in HYBRID)
    assert await router.routable() == sorted(STANDALONE + HYBRID)


async def test_sync_hybrid_weights_only_touches_active_replicas() -> None:
    ctrl, _, replicas, rec = await make()
    assert await ctrl.sync_hybrid_weights(1) is False  # asleep: the next activation syncs
    assert rec.calls == []
    await ctrl.activate(1, None, True)  # positional rebalance flag
    assert await ctrl.sync_hybrid_weights(1) is False  # already at version 1
    assert await ctrl.sync_hybrid_weights(2, "w2") is True
    assert all(replicas[h].weights_version == 2 for h in HYBRID)
    replicas["h0"].fail_next("update_weights")
    with pytest.raises(SwitchError) as info:
        await ctrl.sync_hybrid_weights(3)
    assert info.value.operation == "sync_weights" and info.value.step == "update_weights"
    assert ctrl.state is HybridState.STANDALONE_ONLY


@pytest.mark.parametrize("step", ["wake_up", "update_weights", "resume", "add_to_routing"])
async def test_failed_activation_step_leaves_safe_state(step: str) -> None:
    events = EventBus()
    seen: list[object] = []
    events.subscribe(seen.append)
    ctrl, router, replicas, _ = await make(events=events)
    if step == "add_to_routing":
        router.fail.add("add_replicas")
    else:
        replicas["h1"].fail_next(step)
    with pytest.raises(SwitchError) as info:
        await ctrl.activate(1)
    assert info.value.step == step
    assert info.value.operation == "activate"
    if step != "add_to_routing":
        assert info.value.replica_id == "h1"
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await router.routable() == sorted(STANDALONE)
    assert all(replicas[h].is_asleep for h in HYBRID)  # memory handed back
    assert ctrl.activate_count == 0 and ctrl.failure_count == 1
    switch = [e for e in seen if isinstance(e, SwitchEvent)]
    assert switch and switch[-1].kind == "activate" and not switch[-1].ok
    # A later activation works again.
    assert await ctrl.activate(2) is True


@pytest.mark.parametrize("step", ["remove_from_routing", "abort", "sleep"])
async def test_failed_deactivation_step_leaves_safe_state(step: str) -> None:
    ctrl, router, replicas, _ = await make()
    await ctrl.activate(1)
    if step == "remove_from_routing":
        router.fail.add("remove_replicas")
    else:
        replicas["h0"].fail_next(step)
    with pytest.raises(SwitchError) as info:
        await ctrl.deactivate()
    assert info.value.step == step and info.value.operation == "deactivate"
    assert step in str(info.value)
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await router.routable() == sorted(STANDALONE)
    assert ctrl.deactivate_count == 0


async def test_failed_rebalance_inside_activation_is_safe() -> None:
    ctrl, router, replicas, _ = await make()
    client = RetryingClient(ctrl.replicas)
    tasks = [
        asyncio.create_task(client.generate(GenerateRequest(request_id=f"r{i}", max_tokens=200)))
        for i in range(6)
    ]
    await asyncio.sleep(0.005)
    replicas["s0"].fail_next("abort")
    with pytest.raises(SwitchError) as info:
        await ctrl.activate(1, rebalance=True)
    assert info.value.step == "rebalance"
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await router.routable() == sorted(STANDALONE)
    outcomes = await asyncio.gather(*tasks)
    assert all(o.num_tokens == 200 for o in outcomes)


async def _eventually(read: Any, expected: Any, timeout_s: float = 5.0) -> Any:
    """Poll ``await read()`` until it equals ``expected`` (bounded); return the last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    value = await read()
    while value != expected and loop.time() < deadline:
        await asyncio.sleep(0.001)
        value = await read()
    assert value == expected
    return True


async def test_rebalance_moves_only_the_excess() -> None:
    ctrl, router, _, rec = await make()
    client = RetryingClient(ctrl.replicas)
    tasks = [
        asyncio.create_task(client.generate(GenerateRequest(request_id=f"r{i}", max_tokens=400)))
        for i in range(8)
    ]
    # poll, do not sleep a fixed time: on a loaded machine the requests' (and later the
    # retries') leases can take longer than any fixed sleep to be taken
    assert await _eventually(router.in_flight_counts, {"s0": 4, "s1": 4})
    await ctrl.activate(1, rebalance=True)
    report = ctrl.last_rebalance
    assert report is not None
    assert report.target_share == 2  # 8 requests over 4 routable replicas
    assert report.moved == 4 and dict(report.aborted) == {"s0": 2, "s1": 2}
    aborts = rec.filter(method="abort")
    assert all(len(c.args[0]) == 2 for c in aborts if c.who in STANDALONE)
    assert await _eventually(router.in_flight_counts, {"h0": 2, "h1": 2, "s0": 2, "s1": 2})
    outcomes = await asyncio.gather(*tasks)
    assert sum(o.aborts for o in outcomes) == 4  # the other four were never touched
    assert all(list(o.output_tokens) == list(range(400)) for o in outcomes)


async def test_switches_are_timed_on_the_loop_clock_and_reported() -> None:
    events = EventBus()
    seen: list[object] = []
    events.subscribe(seen.append)
    ctrl, _, _, _ = await make(delays=0.01, events=events)
    await ctrl.activate(1)
    await ctrl.deactivate()
    # wake + update + resume (each 0.01 s, replicas in parallel) and sleep (0.01 s)
    assert ctrl.last_activate_duration_s >= 0.03
    assert ctrl.last_deactivate_duration_s >= 0.01
    switches = [e for e in seen if isinstance(e, SwitchEvent)]
    assert [s.kind for s in switches] == ["activate", "deactivate"]
    assert switches[0].duration_s == pytest.approx(ctrl.last_activate_duration_s)
    transitions = [e for e in seen if isinstance(e, TransitionEvent)]
    assert [(t.source, t.target) for t in transitions] == [
        ("STANDALONE_ONLY", "ACTIVATING"),
        ("ACTIVATING", "HYBRID_ACTIVE"),
        ("HYBRID_ACTIVE", "DEACTIVATING"),
        ("DEACTIVATING", "STANDALONE_ONLY"),
    ]
    for tr in ctrl.state_machine.history:
        assert (tr.source, tr.target) in LEGAL_TRANSITIONS


async def test_every_call_is_bounded_by_the_timeout() -> None:
    rec = CallRecorder()
    stuck = InMemoryReplica(
        "h0", role="hybrid", recorder=rec, options=InMemoryReplicaOptions(wake_delay_s=10.0)
    )
    rs = ReplicaSet(standalone=[InMemoryReplica("s0")], hybrid=[stuck])
    await rs.route(["s0"])
    ctrl = DynamicResourceController(rs, ControllerOptions(call_timeout_s=0.05))
    with pytest.raises(SwitchError) as info:
        await ctrl.activate(1)
    assert info.value.step == "wake_up"
    assert isinstance(info.value.cause, TimeoutError)
    assert ctrl.state is HybridState.STANDALONE_ONLY


async def test_reconcile_and_recovery_from_an_interrupted_switch() -> None:
    ctrl, router, _, _ = await make(delays=0.05)
    task = asyncio.create_task(ctrl.activate(1))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ctrl.state is HybridState.ACTIVATING
    await router.add_replicas(["h0"])
    await ctrl.reconcile()  # resolves the interrupted switch (safe state)
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await router.routable() == sorted(STANDALONE)
    # A hybrid replica made routable behind the controller's back is taken out again.
    await router.add_replicas(["h1"])
    assert await ctrl.reconcile() == ["h1"]
    assert await router.routable() == sorted(STANDALONE)
    assert await ctrl.activate(2) is True


def test_constructor_validation_and_doctest() -> None:
    with pytest.raises(ValueError, match="ControllerOptions.call_timeout_s"):
        ControllerOptions(call_timeout_s=0)
    with pytest.raises(TypeError, match="ReplicaSet"):
        DynamicResourceController(LoadBalancer())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicate"):
        ReplicaSet(hybrid=[InMemoryReplica("h"), InMemoryReplica("h")])
    assert doctest.testmod(controller_module).failed == 0


async def test_dead_hybrid_replicas_leave_the_switch() -> None:
    ctrl, router, replicas, _ = await make()
    await ctrl.activate(1)
    assert ctrl.state is HybridState.HYBRID_ACTIVE
    assert ctrl.replicas.mark_dead("h0") is True
    assert ctrl.replicas.mark_dead("h0") is False
    await ctrl.replicas.settle(1.0)
    assert ctrl.hybrid_ids == ("h1",)
    assert await router.routable() == ["h1", "s0", "s1"]
    assert ctrl.state is HybridState.HYBRID_ACTIVE  # one survivor still serves
    await ctrl.deactivate()
    assert replicas["h1"].is_asleep and not replicas["h0"].is_asleep  # the dead one untouched
    await ctrl.activate(2)
    assert ctrl.is_hybrid_active and replicas["h1"].weights_version == 2
    assert replicas["h0"].weights_version == 1
    ctrl.replicas.mark_dead("h1")
    # the last one gone: the state machine no longer claims hybrid capacity
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await ctrl.activate(3) is False  # no live hybrid replica: a no-op
    await ctrl.replicas.settle(1.0)
    assert await router.routable() == ["s0", "s1"]


async def test_a_hybrid_replica_dying_mid_switch_fails_it_safely() -> None:
    ctrl, router, _, _ = await make(delays=0.02)
    task = asyncio.create_task(ctrl.activate(1))
    await asyncio.sleep(0.01)  # waking up
    ctrl.replicas.mark_dead("h1")
    with pytest.raises(SwitchError) as info:
        await task
    assert info.value.replica_id == "h1"
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert await router.routable() == ["s0", "s1"]
    assert await ctrl.activate(2) is True  # the survivor serves alone
    assert await router.routable() == ["h0", "s0", "s1"]


async def test_cancelling_a_switch_before_its_replica_calls_start_leaves_no_unawaited_coroutine() -> (
    None
):
    """Ctrl-C can land after a switch has fanned out its per-replica calls but before any of
    them ran; cancelling then must not leave a coroutine that was never awaited (Python
    prints a RuntimeWarning for each, seen in a random-interrupt soak of ``simulate``)."""
    import gc
    import inspect
    import warnings

    ctrl, _router, _replicas, _rec = await make()
    switch = asyncio.get_running_loop().create_task(ctrl.activate(1, weights="w"))
    me = asyncio.current_task()

    def fanned_out_not_started() -> bool:
        return any(
            t is not switch
            and t is not me
            and inspect.getcoroutinestate(t.get_coro()) == inspect.CORO_CREATED  # type: ignore[arg-type]
            for t in asyncio.all_tasks()
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(1000):
            await asyncio.sleep(0)
            if fanned_out_not_started():
                break
        else:
            pytest.fail("the switch never fanned out its per-replica calls")
        switch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await switch
        for _ in range(5):
            await asyncio.sleep(0)
        gc.collect()
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert unawaited == []
