"""The GPU hand-over between a trainer and the hybrid replicas on its GPU."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from dynsched_core import InMemoryReplica, ReplicaCapabilities
from dynsched_core.errors import HandOverError
from dynsched_core.trainer import GpuHandOver, HandOverReplica
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule


def test_wake_before_offload_and_reload_before_sleep_raise() -> None:
    h = GpuHandOver()
    h.register_trainer(0)
    h.register_trainer(1)
    h.register_hybrid("h0", [0])
    h.register_hybrid("h1", [1])
    with pytest.raises(HandOverError, match="has not offloaded") as err:
        h.hybrid_waking("h0")
    assert err.value.gpu == 0 and err.value.holders == ("trainer",)
    h.trainer_offloaded(0)
    h.hybrid_waking("h0")
    with pytest.raises(HandOverError, match=r"\['h0'\]"):
        h.trainer_reloading(0)
    h.trainer_reloading(1)  # GPU 1 has no awake hybrid
    h.hybrid_asleep("h0")
    h.trainer_reloading(0)
    assert h.holders(0).trainer_resident and h.holders(0).awake == ()
    # the error survives pickling (it crosses Ray actor boundaries)
    again = pickle.loads(pickle.dumps(err.value))
    assert isinstance(again, HandOverError) and again.gpu == 0


def test_tensor_parallel_replica_needs_every_gpu_free() -> None:
    h = GpuHandOver()
    for g in (0, 1):
        h.register_trainer(g)
    h.register_hybrid("h0", [0, 1])
    h.trainer_offloaded(0)
    with pytest.raises(HandOverError, match="GPU 1"):
        h.hybrid_waking("h0")
    h.trainer_offloaded(1)
    h.hybrid_waking("h0")
    for g in (0, 1):
        with pytest.raises(HandOverError):
            h.trainer_reloading(g)


def test_unreleased_sleep_keeps_the_gpu_unless_allowed() -> None:
    for allow in (False, True):
        h = GpuHandOver(allow_unreleased_sleep=allow)
        h.register_trainer(0, resident=False)
        h.register_hybrid("h0", [0], awake=True)
        h.hybrid_asleep("h0", released=False)
        if allow:
            h.trainer_reloading(0)
        else:
            with pytest.raises(HandOverError):
                h.trainer_reloading(0)
            h.forget_hybrid("h0")  # its process died: memory gone
            h.trainer_reloading(0)


def test_registration_checks() -> None:
    h = GpuHandOver()
    h.register_trainer(0)
    with pytest.raises(HandOverError):
        h.register_hybrid("h0", [0], awake=True)
    with pytest.raises(KeyError, match="nope"):
        h.hybrid_waking("nope")
    with pytest.raises(ValueError, match="at least one GPU"):
        h.register_hybrid("h1", [])


def test_handover_replica_offloads_first_and_records_sleep() -> None:
    h = GpuHandOver()
    h.register_trainer(0)
    order: list[str] = []

    async def offload() -> None:
        order.append("offload")
        h.trainer_offloaded(0)

    async def run() -> None:
        inner = InMemoryReplica("h0", role="hybrid", tokens_per_s=1e5)
        strict = HandOverReplica(InMemoryReplica("h1", role="hybrid"), h, [0])
        with pytest.raises(HandOverError):
            await strict.wake_up()  # no before_wake and the trainer holds GPU 0
        wrapped = HandOverReplica(inner, h, [0], before_wake=offload)
        assert wrapped.replica_id == "h0" and wrapped.capabilities.role == "hybrid"
        await wrapped.wake_up()
        order.append("woken")
        assert h.holders(0).awake == ("h0", "h1") or h.holders(0).awake == ("h0",)
        await wrapped.sleep()
        order.append("slept")

    asyncio.run(run())
    assert order == ["offload", "woken", "slept"]
    assert "h0" not in h.holders(0).awake


class _NoSleep(InMemoryReplica):
    @property
    def capabilities(self) -> ReplicaCapabilities:
        return ReplicaCapabilities(role="hybrid", supports_sleep=False)


def test_replica_without_sleep_mode_keeps_its_gpu() -> None:
    h = GpuHandOver()
    h.register_trainer(0, resident=False)

    async def run() -> None:
        r = HandOverReplica(_NoSleep("h0", role="hybrid"), h, [0])
        await r.wake_up()
        await r.sleep()

    asyncio.run(run())
    with pytest.raises(HandOverError):
        h.trainer_reloading(0)


class HandOverMachine(RuleBasedStateMachine):
    """Any sequence of calls: the trainer and an awake hybrid never share a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.h = GpuHandOver()
        self.gpus = [0, 1]
        for g in self.gpus:
            self.h.register_trainer(g)
        self.hybrids = {"a": (0,), "b": (1,), "c": (0, 1)}
        for rid, gpus in self.hybrids.items():
            self.h.register_hybrid(rid, gpus)
        self.resident = dict.fromkeys(self.gpus, True)
        self.awake: set[str] = set()

    @rule(g=st.sampled_from([0, 1]))
    def offload(self, g: int) -> None:
        self.h.trainer_offloaded(g)
        self.resident[g] = False

    @rule(g=st.sampled_from([0, 1]))
    def reload(self, g: int) -> None:
        blocked = any(g in self.hybrids[r] for r in self.awake)
        if blocked:
            with pytest.raises(HandOverError):
                self.h.trainer_reloading(g)
        else:
            self.h.trainer_reloading(g)
            self.resident[g] = True

    @rule(r=st.sampled_from(["a", "b", "c"]))
    def wake(self, r: str) -> None:
        blocked = any(self.resident[g] for g in self.hybrids[r])
        if blocked:
            with pytest.raises(HandOverError):
                self.h.hybrid_waking(r)
        else:
            self.h.hybrid_waking(r)
            self.awake.add(r)

    @precondition(lambda self: bool(self.awake))
    @rule(data=st.data())
    def sleep(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(sorted(self.awake)))
        self.h.hybrid_asleep(r)
        self.awake.discard(r)

    @invariant()
    def never_shared(self) -> None:
        for g in self.gpus:
            holders = self.h.holders(g)
            assert not (holders.trainer_resident and holders.awake)
            assert holders.trainer_resident == self.resident[g]
            assert set(holders.awake) == {r for r in self.awake if g in self.hybrids[r]}


TestHandOverMachine = HandOverMachine.TestCase


def test_doctest() -> None:
    import doctest

    from dynsched_core import _handover

    assert doctest.testmod(_handover).failed == 0
