"""Stateful test: random switches, failures, requests, aborts and completions.

Each machine run owns one event loop whose clock is virtual (it jumps to the next
timer instead of sleeping), so generation "takes time" without taking real time.

Rules include injected failures of every switch step, a hybrid replica dying in the
middle of an activation or a deactivation (and being restarted later), and two switch
requests overlapping (activate while deactivating, two activations, ...).

Invariants:
- no request is ever routed to a replica that is not routable and able to serve;
- every accepted request ends exactly once (completed, possibly after retries, or
  reported failed);
- only legal transitions happen, chained, and routing agrees with the state;
- while the state says ``STANDALONE_ONLY`` every live hybrid replica is asleep (the
  trainer owns their GPUs);
- overlapping switch requests are serialised in request order, never interleaved.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections import Counter
from collections.abc import Sequence
from typing import Any

from dynsched_core import (
    ClientOptions,
    ControllerOptions,
    DynamicResourceController,
    GenerateRequest,
    HybridState,
    InMemoryReplica,
    InMemoryReplicaOptions,
    LoadBalancer,
    ReplicaSet,
    RetryingClient,
    SwitchError,
)
from dynsched_core._client import RolloutOutcome
from dynsched_core._state import LEGAL_TRANSITIONS, Transition
from dynsched_core.errors import NoRoutableReplicaError, RequestFailedError
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

STANDALONE = ("s0", "s1")
HYBRID = ("h0", "h1")
SWITCH_METHODS = ("wake_up", "update_weights", "resume", "abort", "sleep")
FAILURES = [(h, m) for h in HYBRID for m in SWITCH_METHODS]
FAILURES += [("router", "add"), ("router", "remove")]
FAILURES += [(r, "generate") for r in STANDALONE + HYBRID]
SWITCHES = ("activate", "deactivate", "sync_hybrid_weights", "reconcile")


class _VirtualSelector:
    """Selector that advances the loop's virtual clock instead of blocking."""

    def __init__(self, loop: VirtualTimeLoop, inner: selectors.BaseSelector) -> None:
        self._loop = loop
        self._inner = inner

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("virtual-time loop: nothing ready and no timer (deadlock)")
        if timeout > 0:
            self._loop.vtime += timeout
        return self._inner.select(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time: ``time()`` jumps to the next due timer."""

    def __init__(self) -> None:
        super().__init__()
        self.vtime = 0.0
        self._selector = _VirtualSelector(self, self._selector)  # type: ignore[has-type]

    def time(self) -> float:
        return self.vtime


class CheckingRouter(LoadBalancer):
    """LoadBalancer that checks every routing decision and can fail add/remove once."""

    def __init__(self, ids: Sequence[str], replicas: dict[str, InMemoryReplica]) -> None:
        super().__init__(ids)
        self.replicas = replicas
        self.violations: list[str] = []
        self.fail: set[str] = set()
        self.routed = 0

    async def acquire(self, request_id: str, exclude: Sequence[str] = ()) -> str:
        chosen = self.acquire_nowait(request_id, exclude)
        self.routed += 1
        if not self.is_routable(chosen):
            self.violations.append(f"{request_id} -> {chosen}: not routable")
        if not self.replicas[chosen].is_accepting:
            self.violations.append(f"{request_id} -> {chosen}: routable but cannot serve")
        return chosen

    async def add_replicas(self, replica_ids: Sequence[str]) -> None:
        if "add" in self.fail:
            self.fail.discard("add")
            raise RuntimeError("injected router add failure")
        self.add_replicas_nowait(replica_ids)

    async def remove_replicas(self, replica_ids: Sequence[str]) -> None:
        if "remove" in self.fail:
            self.fail.discard("remove")
            raise RuntimeError("injected router remove failure")
        self.remove_replicas_nowait(replica_ids)


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.replicas: dict[str, InMemoryReplica] = {}
        for sid in STANDALONE:
            self.replicas[sid] = InMemoryReplica(sid, tokens_per_s=100.0, chunk_tokens=4)
        for hid in HYBRID:
            self.replicas[hid] = self.make_hybrid(hid)
        self.router = CheckingRouter([], self.replicas)
        self.set = ReplicaSet(
            self.router,
            standalone=[self.replicas[s] for s in STANDALONE],
            hybrid=[self.replicas[h] for h in HYBRID],
        )
        self.run(self.set.route(list(STANDALONE)))
        self.client = RetryingClient(
            self.set,
            ClientOptions(max_failures=2, backoff_initial_s=0.01, no_replica_timeout_s=30.0),
        )
        self.controller = DynamicResourceController(
            self.set, ControllerOptions(call_timeout_s=10.0)
        )
        self.transitions: list[Transition] = []
        self.controller.state_machine.add_listener(self.transitions.append)
        self.tasks: dict[str, asyncio.Task[RolloutOutcome]] = {}
        self.ends: Counter[str] = Counter()
        self.outcomes: dict[str, object] = {}
        self.version = 0
        self.next_id = 0
        self.deaths_mid_switch = 0

    @staticmethod
    def make_hybrid(hid: str) -> InMemoryReplica:
        return InMemoryReplica(
            hid,
            role="hybrid",
            tokens_per_s=100.0,
            chunk_tokens=4,
            options=InMemoryReplicaOptions(
                wake_delay_s=0.05, sleep_delay_s=0.05, update_delay_s=0.02
            ),
        )

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def in_loop(self, fn: Any, *args: Any) -> Any:
        """Call ``fn`` from inside the running loop, as a runtime's health check does
        (its listeners read the loop's clock; no other test may have left a current loop)."""

        async def call() -> Any:
            return fn(*args)

        return self.run(call())

    # ------------------------------------------------------------------ rules
    @rule(rebalance=st.booleans())
    def activate(self, rebalance: bool) -> None:
        self.version += 1
        try:
            self.run(self.controller.activate(self.version, rebalance=rebalance))
        except SwitchError as exc:
            self.check_safe(exc)

    @rule()
    def deactivate(self) -> None:
        try:
            self.run(self.controller.deactivate())
        except SwitchError as exc:
            self.check_safe(exc)

    @rule(failure=st.sampled_from(FAILURES))
    def inject_failure(self, failure: tuple[str, str]) -> None:
        who, method = failure
        if who == "router":
            self.router.fail.add(method)
        else:
            self.replicas[who].fail_next(method)

    @rule(count=st.integers(1, 6), tokens=st.integers(1, 40))
    def new_requests(self, count: int, tokens: int) -> None:
        for _ in range(count):
            rid = f"r{self.next_id}"
            self.next_id += 1
            request = GenerateRequest(request_id=rid, max_tokens=tokens, target_len=tokens)
            task = self.loop.create_task(self.client.generate(request))
            task.add_done_callback(lambda t, rid=rid: self.record_end(rid, t))
            self.tasks[rid] = task

    @precondition(lambda self: self.controller.state is HybridState.STANDALONE_ONLY)
    @rule(victim=st.sampled_from(HYBRID), after=st.floats(0.0, 0.1))
    def hybrid_dies_during_activation(self, victim: str, after: float) -> None:
        self.version += 1
        self.switch_with_death(self.controller.activate(self.version), victim, after)

    @precondition(lambda self: self.controller.state is HybridState.HYBRID_ACTIVE)
    @rule(victim=st.sampled_from(HYBRID), after=st.floats(0.0, 0.1))
    def hybrid_dies_during_deactivation(self, victim: str, after: float) -> None:
        self.switch_with_death(self.controller.deactivate(), victim, after)

    def switch_with_death(self, switch: Any, victim: str, after: float) -> None:
        """Start ``switch``, kill ``victim`` ``after`` (virtual) seconds in, finish it."""
        task = self.loop.create_task(switch)
        self.run(asyncio.wait({task}, timeout=after))
        if not task.done():
            self.deaths_mid_switch += 1
            event(f"hybrid died mid-switch in {self.controller.state}")
        self.replicas[victim].kill()
        self.in_loop(self.set.mark_dead, victim)  # what a runner's health check reports
        try:
            self.run(task)
        except SwitchError as exc:
            self.check_safe(exc)
        self.run(self.set.settle(timeout_s=10.0))

    @precondition(lambda self: any(not self.set.is_alive(h) for h in HYBRID))
    @rule()
    def restart_dead_hybrid(self) -> None:
        dead = sorted(h for h in HYBRID if not self.set.is_alive(h))[0]
        self.replicas[dead] = self.make_hybrid(dead)  # a fresh engine starts asleep
        self.in_loop(self.set.add, self.replicas[dead])

    @rule(
        first=st.sampled_from(SWITCHES),
        second=st.sampled_from(SWITCHES),
        gap=st.floats(0.0, 0.1),
    )
    def overlapping_switches(self, first: str, second: str, gap: float) -> None:
        """Two switch requests in flight at once: serialised in request order or refused."""

        async def both() -> list[Any]:
            one = asyncio.ensure_future(self.switch(first))
            await asyncio.wait({one}, timeout=gap)  # the second arrives mid-switch
            two = asyncio.ensure_future(self.switch(second))
            return list(await asyncio.gather(one, two, return_exceptions=True))

        results = self.run(both())
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, SwitchError):
                raise result  # an interleaving breaks the machine (illegal transition)
        last = results[-1]
        if isinstance(last, SwitchError):
            self.check_safe(last)
        if second == "deactivate" and not isinstance(last, BaseException):
            assert self.controller.state is HybridState.STANDALONE_ONLY
        if second == "activate" and last is True:
            assert self.controller.state is HybridState.HYBRID_ACTIVE

    async def switch(self, kind: str) -> Any:
        if kind == "activate":
            self.version += 1
            return await self.controller.activate(self.version)
        if kind == "deactivate":
            return await self.controller.deactivate()
        if kind == "sync_hybrid_weights":
            self.version += 1
            return await self.controller.sync_hybrid_weights(self.version)
        return await self.controller.reconcile()

    @precondition(lambda self: any(r.running and r.is_alive for r in self.replicas.values()))
    @rule(data=st.data())
    def abort_one(self, data: st.DataObject) -> None:
        busy = sorted(rid for rid, r in self.replicas.items() if r.running and r.is_alive)
        replica = self.replicas[data.draw(st.sampled_from(busy))]
        request = data.draw(st.sampled_from(replica.running))
        with contextlib.suppress(RuntimeError):  # an injected failure meant for a switch
            self.run(replica.abort([request]))

    @rule(dt=st.floats(0.005, 0.5))
    def advance(self, dt: float) -> None:
        self.run(asyncio.sleep(dt))

    # ------------------------------------------------------------------ checks
    def record_end(self, rid: str, task: asyncio.Task[RolloutOutcome]) -> None:
        self.ends[rid] += 1
        if task.cancelled():
            self.outcomes[rid] = "cancelled"
        else:
            self.outcomes[rid] = task.exception() or task.result()

    def check_safe(self, exc: SwitchError) -> None:
        assert exc.step in (
            "remove_from_routing",
            "abort",
            "sleep",
            "wake_up",
            "update_weights",
            "resume",
            "add_to_routing",
            "rebalance",
        )
        assert self.controller.state is HybridState.STANDALONE_ONLY
        assert not set(HYBRID) & set(self.router.routable_ids())

    @invariant()
    def nothing_routed_to_unroutable_replicas(self) -> None:
        assert self.router.violations == []

    @invariant()
    def only_legal_chained_transitions(self) -> None:
        previous = HybridState.STANDALONE_ONLY
        for tr in self.transitions:
            assert (tr.source, tr.target) in LEGAL_TRANSITIONS
            assert tr.source is previous
            previous = tr.target
        assert previous is self.controller.state

    @invariant()
    def routing_agrees_with_state(self) -> None:
        routable = set(self.router.routable_ids())
        assert set(STANDALONE) <= routable
        live = set(self.set.hybrid_ids)
        assert not (set(HYBRID) - live) & routable  # a dead hybrid is never routable
        lent = set(self.controller.active_hybrid_ids)
        if self.controller.state is HybridState.HYBRID_ACTIVE:
            assert lent and lent <= routable
        assert not (live - lent) & routable  # a hybrid not lent is never routable

    @invariant()
    def hybrids_asleep_while_standalone_only(self) -> None:
        # the trainer owns the hybrid GPUs in STANDALONE_ONLY: no live hybrid engine awake
        if self.controller.state is HybridState.STANDALONE_ONLY:
            awake = [h for h in self.set.hybrid_ids if not self.replicas[h].is_asleep]
            assert awake == [], f"awake while STANDALONE_ONLY: {awake}"
        # a restarted (fresh) hybrid engine is asleep until an activation lends it
        lent = set(self.controller.active_hybrid_ids)
        awake = [h for h in self.set.hybrid_ids if h not in lent and not self.replicas[h].is_asleep]
        assert awake == [], f"awake but not lent: {awake}"

    @invariant()
    def the_router_follows_the_replica_set(self) -> None:
        assert self.set.routable_ids == self.router.routable_ids()

    @invariant()
    def requests_end_at_most_once(self) -> None:
        assert all(count == 1 for count in self.ends.values())

    def teardown(self) -> None:
        try:
            self.run(self.drain())
            assert set(self.ends) == set(self.tasks)  # every accepted request ended ...
            assert all(count == 1 for count in self.ends.values())  # ... exactly once
            for rid, outcome in self.outcomes.items():
                if isinstance(outcome, RolloutOutcome):
                    tokens = self.tasks[rid].result().num_tokens
                    assert list(outcome.output_tokens) == list(range(tokens))
                else:
                    assert isinstance(outcome, RequestFailedError | NoRoutableReplicaError), outcome
            assert self.router.violations == []
        finally:
            self.loop.close()

    async def drain(self) -> None:
        pending = [t for t in self.tasks.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=3600.0)
        assert all(t.done() for t in self.tasks.values()), "requests still running"


ControllerMachine.TestCase.settings = settings(stateful_step_count=40, deadline=None)
TestControllerMachine = ControllerMachine.TestCase


def _switch_fixture() -> tuple[ReplicaSet, DynamicResourceController, dict[str, InMemoryReplica]]:
    replicas = {s: InMemoryReplica(s) for s in STANDALONE}
    replicas.update({h: ControllerMachine.make_hybrid(h) for h in HYBRID})
    rs = ReplicaSet(
        standalone=[replicas[s] for s in STANDALONE], hybrid=[replicas[h] for h in HYBRID]
    )
    return rs, DynamicResourceController(rs, ControllerOptions(call_timeout_s=10.0)), replicas


async def test_failed_activation_after_a_failed_sleep_leaves_every_hybrid_asleep() -> None:
    """The case the invariant found: a sleep failure, an update failure, then activate
    used to end in STANDALONE_ONLY with h1 awake (the safe-state sleep failed once)."""
    rs, ctrl, replicas = _switch_fixture()
    await rs.route(list(STANDALONE))
    replicas["h1"].fail_next("sleep")
    replicas["h0"].fail_next("update_weights")
    with contextlib.suppress(SwitchError):
        await ctrl.activate(1)
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert all(replicas[h].is_asleep for h in HYBRID)
    assert rs.hybrid_ids == list(HYBRID)  # one retry put h1 to sleep: still a member


async def test_hybrid_that_cannot_sleep_is_taken_out_of_the_run() -> None:
    rs, ctrl, replicas = _switch_fixture()
    await rs.route(list(STANDALONE))
    replicas["h1"].fail_next("sleep", times=ctrl.options.sleep_attempts)
    replicas["h0"].fail_next("update_weights")
    with contextlib.suppress(SwitchError):
        await ctrl.activate(1)
    assert ctrl.state is HybridState.STANDALONE_ONLY
    assert not replicas["h1"].is_asleep and rs.dead_ids == ["h1"]  # honest: not a live member
    assert rs.hybrid_ids == ["h0"] and replicas["h0"].is_asleep
    assert "h1" not in rs.routable_ids
    assert await ctrl.activate(2) and ctrl.active_hybrid_ids == ("h0",)
