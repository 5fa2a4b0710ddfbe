"""ReplicaSet: the one owner of membership; every reader sees the same set.

The readers are the router (follows the set), the retrying client (looks replicas up
and waits for routable ones), the rollouter's concurrency cap, the controller (switches
the live hybrid members) and the driver's context (counts, colocated mode).
"""

from __future__ import annotations

import asyncio
import doctest
from typing import Any

import dynsched_core._replicas as replicas_module
import pytest
from dynsched_core import (
    AsyncSampleQueue,
    ClientOptions,
    DynamicResourceController,
    DynamicScheduleConfig,
    DynamicSchedulePolicyBase,
    EventBus,
    GenerateRequest,
    HybridState,
    InMemoryReplica,
    LoadBalancer,
    ReplicaSet,
    RetryingClient,
    Rollouter,
    RollouterOptions,
    ScheduleDriver,
)
from dynsched_core.events import MembershipEvent
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)


class Idle(DynamicSchedulePolicyBase):
    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        return False

    def deactivate_wait_samples(self, ctx: Any) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: Any
    ) -> bool:
        return False


class Readers:
    """Every reader of one ReplicaSet, built as the reference loop builds them."""

    def __init__(self, replicas: ReplicaSet) -> None:
        self.replicas = replicas
        self.config = DynamicScheduleConfig(
            use_dynamic_resource_scheduling=True,
            ppo_mini_batch_size=2,
            concurrent_samples_per_replica=3,
            staleness_threshold=10.0,
        )
        self.queue = AsyncSampleQueue()
        self.client = RetryingClient(replicas, ClientOptions(no_replica_timeout_s=5.0))
        self.controller = DynamicResourceController(replicas)
        self.rollouter = Rollouter(
            [], self.client, replicas, self.queue, RollouterOptions.from_config(self.config)
        )
        self.driver = ScheduleDriver(Idle(), self.controller, self.queue, self.config)

    async def check(self) -> None:
        """Each reader agrees with the set (after the router caught up with deaths)."""
        rs = self.replicas
        await rs.settle(1.0)
        routable = rs.routable_ids
        assert await rs.router.routable() == routable  # the router follows
        assert self.rollouter.capacity == self.rollouter.options.capacity(len(routable))
        assert list(self.controller.hybrid_ids) == rs.hybrid_ids
        assert self.controller.has_hybrid_replicas == bool(rs.hybrid_ids)
        ctx = await self.driver.context(1)
        assert ctx.num_standalone_replicas == len(rs.standalone_ids)
        assert ctx.num_hybrid_replicas == len(rs.hybrid_ids)
        assert ctx.only_hybrid == (not rs.standalone_ids)
        for member in rs.members():
            replica = self.client.replicas.get(member.replica_id)
            assert (replica is not None) == member.alive


async def test_add_kill_and_re_add_through_the_one_owner() -> None:
    events = EventBus()
    seen: list[MembershipEvent] = []
    events.subscribe(seen.append, MembershipEvent)
    rs = ReplicaSet(
        standalone=[InMemoryReplica("s0"), InMemoryReplica("s1")],
        hybrid=[InMemoryReplica("h0", role="hybrid")],
        events=events,
    )
    readers = Readers(rs)
    await rs.route(rs.standalone_ids)
    await readers.check()
    assert readers.rollouter.capacity == 6

    # add: a member, not routable until routed
    s2 = InMemoryReplica("s2")
    rs.add(s2)
    assert rs.standalone_ids == ["s0", "s1", "s2"] and rs.routable_ids == ["s0", "s1"]
    await readers.check()
    await rs.route(["s2"])
    await readers.check()
    assert readers.rollouter.capacity == 9

    # kill: every reader drops it at once, the router right after
    assert rs.mark_dead("s1") and not rs.mark_dead("s1")
    assert "s1" not in rs and rs.get("s1") is None and rs.dead_ids == ["s1"]
    assert readers.rollouter.capacity == 6  # before the router caught up
    await readers.check()
    assert rs.role_of("s1") == "standalone" and not rs.is_alive("s1")
    with pytest.raises(KeyError):
        rs["s1"]

    # re-add: a fresh engine takes the dead member's place
    fresh = InMemoryReplica("s1")
    rs.add(fresh)
    assert rs.get("s1") is fresh and rs.dead_ids == []
    await rs.route(["s1"])
    await readers.check()
    assert readers.rollouter.capacity == 9
    # a live id cannot be taken
    with pytest.raises(ValueError, match="duplicate replica id 's1'"):
        rs.add(InMemoryReplica("s1"))

    # every standalone replica lost: the driver's context says colocated
    for rid in ["s0", "s1", "s2"]:
        rs.mark_dead(rid)
    await readers.check()
    assert readers.driver.only_hybrid and rs.routable_ids == []
    assert await rs.remove("s0") and not await rs.remove("s0")
    assert [m.replica_id for m in rs.members()] == ["h0", "s1", "s2"]
    kinds = [e.kind for e in seen]
    assert kinds[:4] == ["routed", "added", "routed", "died"]
    assert kinds.count("died") == 4 and kinds[-1] == "removed"
    assert all(e.routable == tuple(sorted(e.routable)) for e in seen)


async def test_a_dead_member_is_never_routed_and_requests_avoid_it() -> None:
    rs = ReplicaSet(standalone=[InMemoryReplica("a"), InMemoryReplica("b")])
    await rs.route(["a", "b"])
    client = RetryingClient(rs, ClientOptions(backoff_initial_s=0.0))
    rs.mark_dead("a")  # the router has not caught up yet
    assert await rs.router.routable() == ["a", "b"]
    outs = await asyncio.gather(
        *(client.generate(GenerateRequest(request_id=f"q{i}", max_tokens=2)) for i in range(4))
    )
    assert all(o.replica_ids == ("b",) and o.failures == 0 for o in outs)
    await rs.route(["a"])  # dead: skipped, never exposed
    await rs.settle(1.0)
    assert await rs.router.routable() == ["b"]


async def test_a_waiting_request_is_woken_by_a_routed_member() -> None:
    rs = ReplicaSet(standalone=[InMemoryReplica("a")])
    client = RetryingClient(rs, ClientOptions(no_replica_timeout_s=5.0))
    task = asyncio.create_task(client.generate(GenerateRequest(request_id="q", max_tokens=2)))
    await asyncio.sleep(0.01)
    assert not task.done()
    rs.add(InMemoryReplica("b"))  # a member, not routable: no wake-up
    await asyncio.sleep(0.01)
    assert not task.done()
    await rs.route(["b"])
    out = await asyncio.wait_for(task, 2.0)
    assert out.replica_ids == ("b",)


async def test_losing_the_last_live_hybrid_replica_ends_the_active_state() -> None:
    rs = ReplicaSet(
        standalone=[InMemoryReplica("s0")],
        hybrid=[InMemoryReplica("h0", role="hybrid"), InMemoryReplica("h1", role="hybrid")],
    )
    await rs.route(["s0"])
    ctrl = DynamicResourceController(rs)
    await ctrl.activate(1)
    rs.mark_dead("h0")
    assert ctrl.state is HybridState.HYBRID_ACTIVE
    rs.mark_dead("h1")
    assert ctrl.state is HybridState.STANDALONE_ONLY
    await rs.settle(1.0)
    assert rs.routable_ids == ["s0"] == await rs.router.routable()
    rs.add(InMemoryReplica("h0", role="hybrid"))  # a restarted engine
    assert await ctrl.activate(2) is True
    assert rs.routable_ids == ["h0", "s0"]


async def test_routing_failures_record_nothing() -> None:
    class Broken(LoadBalancer):
        async def add_replicas(self, replica_ids: Any) -> None:
            raise RuntimeError("router down")

    rs = ReplicaSet(Broken(), standalone=[InMemoryReplica("a")])
    with pytest.raises(RuntimeError, match="router down"):
        await rs.route(["a"])
    assert rs.routable_ids == [] and rs.version == 0
    with pytest.raises(KeyError, match="not a member"):
        await rs.route(["ghost"])
    with pytest.raises(KeyError, match="not a member"):
        await rs.unroute(["ghost"])


def test_construction_errors_and_doctest() -> None:
    with pytest.raises(ValueError, match="duplicate replica id 'x'"):
        ReplicaSet(standalone=[InMemoryReplica("x")], hybrid=[InMemoryReplica("x")])
    with pytest.raises(ValueError, match="role of replica 'x'"):
        ReplicaSet().add(InMemoryReplica("x"), role="trainer")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        ReplicaSet().subscribe(42)  # type: ignore[arg-type]
    assert doctest.testmod(replicas_module).failed == 0


# ------------------------------------------------------------------ state machine
class MembershipMachine(RuleBasedStateMachine):
    """Random adds, deaths, re-adds, routing changes and removals; every reader agrees."""

    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.replicas = ReplicaSet()
        self.readers = Readers(self.replicas)
        self.model: dict[str, dict[str, Any]] = {}  # id -> role, alive, routable
        self.next_id = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @initialize(target=ids)
    def first(self) -> str:
        return self.add(role="standalone")

    @rule(target=ids, role=st.sampled_from(["standalone", "hybrid"]))
    def add(self, role: str) -> str:
        rid = f"{role[0]}{self.next_id}"
        self.next_id += 1
        self.replicas.add(InMemoryReplica(rid, role=role))  # type: ignore[arg-type]
        self.model[rid] = {"role": role, "alive": True, "routable": False}
        return rid

    @rule(rid=ids)
    def route(self, rid: str) -> None:
        if rid not in self.model:
            return
        self.run(self.replicas.route([rid]))
        if self.model[rid]["alive"]:
            self.model[rid]["routable"] = True

    @rule(rid=ids)
    def unroute(self, rid: str) -> None:
        if rid not in self.model:
            return
        self.run(self.replicas.unroute([rid]))
        self.model[rid]["routable"] = False

    @rule(rid=ids)
    def kill(self, rid: str) -> None:
        if rid not in self.model:
            return
        was_alive = self.model[rid]["alive"]
        assert self.replicas.mark_dead(rid) is was_alive
        self.model[rid].update(alive=False, routable=False)

    @precondition(lambda self: any(not m["alive"] for m in self.model.values()))
    @rule(data=st.data())
    def re_add(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(r for r, m in self.model.items() if not m["alive"])))
        role = self.model[rid]["role"]
        self.replicas.add(InMemoryReplica(rid, role=role))
        self.model[rid].update(alive=True, routable=False)

    @rule(rid=consumes(ids))
    def remove(self, rid: str) -> None:
        assert self.run(self.replicas.remove(rid)) is (rid in self.model)
        self.model.pop(rid, None)

    @invariant()
    def the_set_is_the_model(self) -> None:
        rs = self.replicas
        live = {r for r, m in self.model.items() if m["alive"]}
        assert set(rs) == live and len(rs) == len(live)
        assert rs.routable_ids == sorted(r for r, m in self.model.items() if m["routable"])
        assert rs.standalone_ids == sorted(r for r in live if self.model[r]["role"] == "standalone")
        assert set(rs.dead_ids) == set(self.model) - live

    @invariant()
    def every_reader_sees_the_same_set(self) -> None:
        self.run(self.readers.check())

    def teardown(self) -> None:
        self.loop.close()


MembershipMachine.TestCase.settings = settings(stateful_step_count=30, deadline=None)
TestMembershipMachine = MembershipMachine.TestCase
