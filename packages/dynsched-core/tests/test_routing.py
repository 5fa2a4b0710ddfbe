"""LoadBalancer: least-loaded routing, sticky LRU, exactly-once release, listeners."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from dynsched_core import LoadBalancer, Router
from dynsched_core.errors import NoRoutableReplicaError
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)


async def test_implements_router_protocol() -> None:
    assert isinstance(LoadBalancer(), Router)


async def test_least_loaded_ties_broken_by_id() -> None:
    lb = LoadBalancer(["c", "a", "b"])
    picks = [await lb.acquire(f"r{i}") for i in range(7)]
    assert picks == ["a", "b", "c", "a", "b", "c", "a"]
    assert await lb.in_flight_counts() == {"a": 3, "b": 2, "c": 2}


async def test_least_loaded_follows_releases() -> None:
    lb = LoadBalancer(["a", "b"])
    assert await lb.acquire("r1") == "a"
    assert await lb.acquire("r2") == "b"
    assert await lb.acquire("r3") == "a"
    await lb.release("r3", "a")
    await lb.release("r1", "a")
    # a has 0, b has 1
    assert await lb.acquire("r4") == "a"


async def test_exclude_and_no_routable() -> None:
    lb = LoadBalancer(["a", "b"])
    assert await lb.acquire("r1", exclude=["a"]) == "b"
    with pytest.raises(NoRoutableReplicaError, match="excluded"):
        await lb.acquire("r2", exclude=["a", "b"])
    with pytest.raises(NoRoutableReplicaError):
        await LoadBalancer().acquire("r")


async def test_sticky_retry_returns_to_same_replica_even_if_busier() -> None:
    lb = LoadBalancer(["a", "b"])
    assert await lb.acquire("req") == "a"
    await lb.release("req", "a")
    await lb.acquire("x1")  # a
    await lb.acquire("x2")  # b
    await lb.acquire("x3")  # a -> a=2, b=1
    assert await lb.acquire("req") == "a"
    assert lb.sticky_replica("req") == "a"


async def test_sticky_skipped_when_excluded_and_updated() -> None:
    lb = LoadBalancer(["a", "b"])
    assert await lb.acquire("req") == "a"
    await lb.release("req", "a")
    assert await lb.acquire("req", exclude=["a"]) == "b"
    assert lb.sticky_replica("req") == "b"


async def test_removal_drops_sticky_entries_and_leases() -> None:
    lb = LoadBalancer(["a", "b"])
    assert await lb.acquire("r1") == "a"
    assert await lb.acquire("r2") == "b"
    assert await lb.acquire("r3") == "a"
    await lb.remove_replicas(["a"])
    assert lb.sticky_replica("r1") is None
    assert lb.sticky_replica("r3") is None
    assert lb.sticky_replica("r2") == "b"
    assert await lb.in_flight_counts() == {"b": 1}
    assert lb.in_flight_of("a") == 0
    # a retry of r1 goes elsewhere; the stale release is a no-op
    assert await lb.acquire("r1") == "b"
    await lb.release("r1", "a")
    assert lb.in_flight_of("b") == 2
    # re-adding starts from zero leases
    await lb.add_replicas(["a"])
    assert await lb.in_flight_counts() == {"a": 0, "b": 2}


async def test_sticky_lru_is_bounded_and_touch_refreshes() -> None:
    lb = LoadBalancer(["a", "b", "c"], sticky_capacity=2)
    await lb.acquire("r1")
    await lb.acquire("r2")
    await lb.acquire("r1")  # touch r1: r2 is now the least recently used
    await lb.acquire("r3")
    assert lb.sticky_size == 2
    assert lb.sticky_replica("r2") is None
    assert lb.sticky_replica("r1") is not None
    assert lb.sticky_replica("r3") is not None


async def test_sticky_disabled_with_zero_capacity() -> None:
    lb = LoadBalancer(["a", "b"], sticky_capacity=0)
    assert await lb.acquire("req") == "a"
    await lb.release("req", "a")
    await lb.acquire("x")  # a
    assert await lb.acquire("req") == "b"
    assert lb.sticky_size == 0


async def test_clear_sticky_and_forget() -> None:
    lb = LoadBalancer(["a", "b"])
    await lb.acquire("r1")
    await lb.acquire("r2")
    lb.forget("r1")
    assert lb.sticky_replica("r1") is None
    assert lb.sticky_size == 1
    await lb.clear_sticky()
    assert lb.sticky_size == 0
    assert lb.total_in_flight() == 2  # leases untouched


async def test_release_exactly_once() -> None:
    lb = LoadBalancer(["a"])
    await lb.acquire("r1")
    await lb.acquire("r2")
    await lb.release("r1", "a")
    await lb.release("r1", "a")  # double release: no-op
    await lb.release("never", "a")  # unknown lease: no-op
    await lb.release("r2", "zzz")  # unknown replica: no-op
    assert lb.in_flight_of("a") == 1
    assert lb.requests_on("a") == ["r2"]


async def test_same_request_same_replica_is_one_lease() -> None:
    lb = LoadBalancer(["a"])
    await lb.acquire("r1")
    await lb.acquire("r1")
    assert lb.in_flight_of("a") == 1
    await lb.release("r1", "a")
    assert lb.in_flight_of("a") == 0


async def test_listeners_fire_on_every_change_only() -> None:
    lb = LoadBalancer(["a"])
    seen: list[list[str]] = []
    lb.add_listener(lambda ids: seen.append(list(ids)))
    await lb.add_replicas(["b", "a"])
    await lb.add_replicas(["a", "b"])  # no change
    await lb.remove_replicas(["zzz"])  # no change
    await lb.remove_replicas(["a"])
    await lb.acquire("r")  # leases do not change the routable set
    await lb.remove_replicas(["b"])
    assert seen == [["a", "b"], ["b"], []]


async def test_failing_listener_does_not_block_others() -> None:
    lb = LoadBalancer()
    seen: list[Sequence[str]] = []

    def bad(ids: Sequence[str]) -> None:
        raise RuntimeError("boom")

    lb.add_listener(bad)
    lb.add_listener(seen.append)
    await lb.add_replicas(["a"])
    assert seen == [["a"]]
    lb.remove_listener(bad)
    lb.remove_listener(bad)  # unknown: no-op
    await lb.add_replicas(["b"])
    assert seen == [["a"], ["a", "b"]]


async def test_routable_sorted_and_helpers() -> None:
    lb = LoadBalancer(["b", "a"])
    assert await lb.routable() == ["a", "b"]
    assert lb.routable_ids() == ["a", "b"]
    assert lb.is_routable("a")
    assert not lb.is_routable("c")
    assert "LoadBalancer" in repr(lb)


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_bad_sticky_capacity(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="sticky_capacity"):
        LoadBalancer(sticky_capacity=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("ids", ["ab", ["a", ""], [1]])
def test_bad_replica_ids(ids: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        LoadBalancer(ids)  # type: ignore[arg-type]


def test_listener_must_be_callable() -> None:
    with pytest.raises(TypeError):
        LoadBalancer().add_listener(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- property
REPLICAS = ["r0", "r1", "r2", "r3"]


class LoadBalancerMachine(RuleBasedStateMachine):
    """Random add/remove/acquire/release/clear against a simple model."""

    leases = Bundle("leases")

    @initialize(cap=st.integers(min_value=0, max_value=4))
    def setup(self, cap: int) -> None:
        self.lb = LoadBalancer(sticky_capacity=cap)
        self.cap = cap
        self.routable: set[str] = set()
        self.live: set[tuple[str, str]] = set()  # (request id, replica id)
        self.notified: list[list[str]] = []
        self.lb.add_listener(lambda ids: self.notified.append(list(ids)))
        self.next_req = 0

    @rule(ids=st.lists(st.sampled_from(REPLICAS), max_size=3))
    def add(self, ids: list[str]) -> None:
        before = len(self.notified)
        changed = bool(set(ids) - self.routable)
        self.lb.add_replicas_nowait(ids)
        self.routable |= set(ids)
        assert len(self.notified) == before + changed
        if changed:
            assert self.notified[-1] == sorted(self.routable)

    @rule(ids=st.lists(st.sampled_from(REPLICAS), max_size=3))
    def remove(self, ids: list[str]) -> None:
        before = len(self.notified)
        changed = bool(set(ids) & self.routable)
        self.lb.remove_replicas_nowait(ids)
        self.routable -= set(ids)
        self.live = {(q, r) for q, r in self.live if r in self.routable}
        assert len(self.notified) == before + changed
        for rid in ids:
            for q in list(self._requests()):
                assert self.lb.sticky_replica(q) != rid

    def _requests(self) -> list[str]:
        return [f"q{i}" for i in range(self.next_req)]

    @rule(
        target=leases,
        reuse=st.booleans(),
        pick=st.integers(min_value=0, max_value=50),
        exclude=st.lists(st.sampled_from(REPLICAS), max_size=2),
    )
    def acquire(self, reuse: bool, pick: int, exclude: list[str]) -> tuple[str, str]:
        if reuse and self.next_req:
            req = f"q{pick % self.next_req}"
        else:
            req = f"q{self.next_req}"
            self.next_req += 1
        candidates = self.routable - set(exclude)
        sticky = self.lb.sticky_replica(req)
        loads = self.lb.in_flight_counts_nowait()
        if not candidates:
            try:
                self.lb.acquire_nowait(req, exclude)
            except NoRoutableReplicaError:
                return (req, "")
            raise AssertionError("acquire succeeded with no candidate")
        chosen = self.lb.acquire_nowait(req, exclude)
        assert chosen in candidates, "routed to a non-routable or excluded replica"
        if sticky is not None and sticky in candidates:
            assert chosen == sticky
        else:
            best = min(candidates, key=lambda r: (loads[r], r))
            assert chosen == best
        self.live.add((req, chosen))
        if self.cap > 0:
            assert self.lb.sticky_replica(req) == chosen
        return (req, chosen)

    @rule(lease=leases)
    def release(self, lease: tuple[str, str]) -> None:
        req, rid = lease
        self.lb.release_nowait(req, rid)  # possibly a second time: must be a no-op
        self.live.discard((req, rid))

    @rule()
    def clear(self) -> None:
        self.lb.clear_sticky_nowait()
        assert self.lb.sticky_size == 0

    @invariant()
    def counts_match_live_leases(self) -> None:
        if not hasattr(self, "lb"):
            return
        expected = {r: 0 for r in sorted(self.routable)}
        for _, r in self.live:
            expected[r] += 1
        assert self.lb.in_flight_counts_nowait() == expected
        assert self.lb.total_in_flight() == len(self.live)
        assert self.lb.routable_ids() == sorted(self.routable)

    @invariant()
    def sticky_bounded_and_routable(self) -> None:
        if not hasattr(self, "lb"):
            return
        assert self.lb.sticky_size <= self.cap
        for q in self._requests():
            s = self.lb.sticky_replica(q)
            assert s is None or s in self.routable


TestLoadBalancerMachine = LoadBalancerMachine.TestCase
