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
from dynsched_core._replicas import ReplicaPlacement, ReplicaSpec
from dynsched_core.events import MembershipEvent
from dynsched_core.trainer import GpuHandOver
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


# ------------------------------------------------------------------ the replica record
def _on(*gpus: int, pool: str = "trainer", node: str = "") -> ReplicaPlacement:
    return ReplicaPlacement(pool=pool, bundle=gpus[0], gpu_ids=gpus, node=node)


def test_a_member_carries_its_record_across_death_and_re_add() -> None:
    spec = ReplicaSpec(factory=InMemoryReplica, options={"role": "hybrid"})
    rs = ReplicaSet()
    first = InMemoryReplica("h0", role="hybrid")
    rs.add(first, "hybrid", placement=_on(0, 1, node="n1"), spec=spec)
    member = rs.member("h0")
    assert member.placement == _on(0, 1, node="n1") and member.spec == spec
    assert member.replica is first and member.alive and not member.routable
    assert rs.placement_of("h0").gpu_ids == (0, 1)
    rs.mark_dead("h0")
    assert rs.member("h0").placement == _on(0, 1, node="n1") and not rs.member("h0").alive
    fresh = InMemoryReplica("h0", role="hybrid")
    rs.add(fresh, "hybrid")  # a restart brings no record: it keeps the dead member's
    assert rs.member("h0").replica is fresh and rs.member("h0").spec == spec
    assert rs.placement_of("h0") == _on(0, 1, node="n1")
    rs.mark_dead("h0")
    rs.add(InMemoryReplica("h0", role="hybrid"), "hybrid", placement=_on(0, 1, node="n2"))
    assert rs.placement_of("h0").node == "n2" and rs.member("h0").spec == spec
    assert [m.placement for m in rs.members()] == [_on(0, 1, node="n2")]


def test_records_are_checked_and_filled_later() -> None:
    rs = ReplicaSet(
        standalone=[InMemoryReplica("s0")], hybrid=[InMemoryReplica("h0", role="hybrid")]
    )
    with pytest.raises(KeyError, match="no placement record"):
        rs.placement_of("s0")
    with pytest.raises(KeyError, match="not a member"):
        rs.member("ghost")
    rs.set_record("h0", placement=_on(2))
    rs.set_record("s0", placement=_on(2, pool="standalone"))  # another pool: no clash
    assert rs.placement_of("h0").gpu_ids == (2,) and rs.member("h0").spec is None
    with pytest.raises(ValueError, match=r"GPU\(s\) \[2\] of pool 'trainer': live member 'h0'"):
        rs.add(InMemoryReplica("h1", role="hybrid"), placement=_on(1, 2))
    assert "h1" not in rs and rs.version == 0  # nothing recorded, nothing published
    with pytest.raises(ValueError, match="live member 'h0'"):
        rs.set_record("s0", placement=_on(2))
    rs.mark_dead("h0")  # a dead member's GPUs are free
    rs.add(InMemoryReplica("h1", role="hybrid"), placement=_on(1, 2))
    with pytest.raises(ValueError, match="live member 'h1'"):
        rs.add(InMemoryReplica("h0", role="hybrid"))  # its kept record clashes now
    with pytest.raises(ValueError, match="must not repeat"):
        ReplicaPlacement(gpu_ids=(1, 1))
    with pytest.raises(ValueError, match="ints >= 0"):
        ReplicaPlacement(gpu_ids=(-1,))
    with pytest.raises(TypeError, match="sequence of ints"):
        ReplicaPlacement(gpu_ids="01")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ReplicaSpec(factory="not callable")  # type: ignore[arg-type]


def test_the_hand_over_follows_the_set_without_a_hand_call() -> None:
    rs = ReplicaSet(
        hybrid=[InMemoryReplica("h0", role="hybrid"), InMemoryReplica("h1", role="hybrid")]
    )
    handover = GpuHandOver()
    handover.register_trainer(0, resident=False)
    handover.register_hybrid("h0", [0], awake=True)
    handover.register_hybrid("h1", [0], awake=True)
    stop = handover.follow(rs)
    rs.mark_dead("h0")
    assert handover.holders(0).awake == ("h1",)
    assert [e for e, _ in handover.log] == ["forget:h0"]
    handover.forget_hybrid("h0")  # the old hand call stays harmless
    assert [e for e, _ in handover.log] == ["forget:h0"]
    stop()
    rs.mark_dead("h1")
    assert handover.holders(0).awake == ("h1",)  # no longer following


class RecordMachine(RuleBasedStateMachine):
    """Random launches, deaths and restarts of replicas with GPU records; a hand-over
    follows the set. The records survive deaths, no two live members of a pool share a
    GPU, and the hand-over holds exactly the live hybrid members."""

    ids = Bundle("record_ids")

    def __init__(self) -> None:
        super().__init__()
        self.replicas = ReplicaSet()
        self.handover = GpuHandOver()
        for gpu in range(4):
            self.handover.register_trainer(gpu, resident=False)
        self.handover.follow(self.replicas)
        self.deaths: list[str] = []
        self.replicas.subscribe(
            lambda e: self.deaths.extend(e.replica_ids) if e.kind == "died" else None
        )
        self.model: dict[str, tuple[ReplicaPlacement, bool]] = {}  # id -> placement, alive
        self.killed: list[str] = []
        self.next_id = 0

    def _free(self, placement: ReplicaPlacement, rid: str) -> bool:
        return not any(
            alive and p.pool == placement.pool and set(p.gpu_ids) & set(placement.gpu_ids)
            for r, (p, alive) in self.model.items()
            if r != rid
        )

    def _register(self, rid: str, placement: ReplicaPlacement) -> None:
        if placement.pool == "trainer":  # what the run's hybrid wrapper does
            self.handover.register_hybrid(rid, placement.gpu_ids, awake=True)

    @rule(
        target=ids,
        pool=st.sampled_from(["trainer", "standalone"]),
        gpus=st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True),
    )
    def launch(self, pool: str, gpus: list[int]) -> str:
        rid = f"r{self.next_id}"
        self.next_id += 1
        placement = ReplicaPlacement(pool=pool, bundle=gpus[0], gpu_ids=gpus)
        role = "hybrid" if pool == "trainer" else "standalone"
        replica = InMemoryReplica(rid, role=role)  # type: ignore[arg-type]
        if not self._free(placement, rid):
            with pytest.raises(ValueError, match="already does"):
                self.replicas.add(replica, placement=placement)
            return rid
        self._register(rid, placement)
        self.replicas.add(replica, placement=placement)
        self.model[rid] = (placement, True)
        return rid

    @rule(rid=ids)
    def kill(self, rid: str) -> None:
        alive = rid in self.model and self.model[rid][1]
        assert self.replicas.mark_dead(rid) is alive
        if alive:
            self.model[rid] = (self.model[rid][0], False)
            self.killed.append(rid)

    @rule(rid=ids)
    def restart(self, rid: str) -> None:
        if rid not in self.model or self.model[rid][1]:
            return
        placement = self.model[rid][0]
        replica = InMemoryReplica(rid, role=self.replicas.role_of(rid))
        if not self._free(placement, rid):
            with pytest.raises(ValueError, match="already does"):
                self.replicas.add(replica)
            return
        self._register(rid, placement)
        self.replicas.add(replica)  # no record given: the dead member's is kept
        self.model[rid] = (placement, True)

    @invariant()
    def records_survive_deaths(self) -> None:
        for rid, (placement, alive) in self.model.items():
            assert self.replicas.placement_of(rid) == placement
            assert self.replicas.is_alive(rid) is alive
        assert self.deaths == self.killed

    @invariant()
    def gpu_ids_are_unique_per_live_member(self) -> None:
        for pool in ("trainer", "standalone"):
            gpus = [
                g
                for m in self.replicas.members()
                if m.alive and m.placement is not None and m.placement.pool == pool
                for g in m.placement.gpu_ids
            ]
            assert len(gpus) == len(set(gpus))

    @invariant()
    def the_hand_over_holds_the_live_hybrid_members(self) -> None:
        for gpu in range(4):
            expected = sorted(
                rid
                for rid, (p, alive) in self.model.items()
                if alive and p.pool == "trainer" and gpu in p.gpu_ids
            )
            assert list(self.handover.holders(gpu).awake) == expected


RecordMachine.TestCase.settings = settings(stateful_step_count=30, deadline=None)
TestRecordMachine = RecordMachine.TestCase
