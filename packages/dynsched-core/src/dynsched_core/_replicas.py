"""`ReplicaSet`: the one owner of replica membership, liveness and routability.

Every replica of a run is a member with a *role* (``standalone`` or ``hybrid``), a
*liveness* (alive until `ReplicaSet.mark_dead`), a *routability* (in the router's
routable set or not) and, when a runtime launched it, its *record*: where it runs
(`ReplicaPlacement`: pool, bundle, GPU ids, node) and how it is built (`ReplicaSpec`:
factory and options, what a supervisor needs to start it again). A fresh replica that
takes a dead member's id keeps that record unless it brings its own. Nothing else keeps
a copy of these facts: the router follows the
set (every routability change is applied to the `Router` first, then recorded), and the
readers subscribe to its changes or read it when they need it:

- the `RetryingClient` looks replicas up in it and waits for its routable set to change;
- the `Rollouter` sizes its concurrency cap from the routable count;
- the `DynamicResourceController` switches its live hybrid members;
- the `ScheduleDriver` counts its live members for the policy context.

A runtime (the simulator, the Ray runner, a host stack) changes membership only here:
`add` a replica (a dead member's id may be re-used by a fresh replica), `route` /
`unroute` it, `mark_dead` it when its engine is found dead, `remove` it for good.
Subscribers hear of each change synchronously, in subscription order, right after it
was made.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs

from dynsched_core import validators as v
from dynsched_core._clock import Clock, LoopClock
from dynsched_core._events import EventBus
from dynsched_core._protocols import ReplicaRole, RolloutReplica, Router
from dynsched_core._routing import LoadBalancer

__all__ = [
    "MembershipEvent",
    "MembershipFollower",
    "MembershipKind",
    "ReplicaMember",
    "ReplicaPlacement",
    "ReplicaSet",
    "ReplicaSpec",
]

logger = logging.getLogger(__name__)

MembershipKind = Literal["added", "removed", "died", "routed", "unrouted"]
ROLES: tuple[ReplicaRole, ...] = ("standalone", "hybrid")


def _gpu_ids(value: Iterable[int]) -> tuple[int, ...]:
    if isinstance(value, str | bytes):
        raise TypeError(f"ReplicaPlacement.gpu_ids must be a sequence of ints, got {value!r}")
    ids = tuple(value)
    for gpu in ids:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise ValueError(f"ReplicaPlacement.gpu_ids must be ints >= 0, got {ids!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"ReplicaPlacement.gpu_ids must not repeat a GPU, got {ids!r}")
    return ids


@attrs.frozen(kw_only=True)
class ReplicaPlacement:
    """Where a replica runs: computed once by the runtime that launches it.

    Attributes:
        pool: The resource pool (e.g. ``"trainer"`` for hybrid replicas, ``"standalone"``).
        bundle: Index of its bundle in the pool (None: not placed on bundles).
        gpu_ids: The pool's GPUs it sits on (for a hybrid replica: the trainer GPUs it
            shares with the trainer, the keys of the hand-over); unique, ints >= 0.
        node: The node it runs on ("" while unknown; a restart may move it).

    Example:
        >>> ReplicaPlacement(pool="trainer", bundle=2, gpu_ids=[2, 3]).gpu_ids
        (2, 3)
    """

    pool: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    bundle: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(
            [attrs.validators.instance_of(int), attrs.validators.ge(0)]
        ),
    )
    gpu_ids: tuple[int, ...] = attrs.field(default=(), converter=_gpu_ids)
    node: str = attrs.field(default="", validator=attrs.validators.instance_of(str))


@attrs.frozen(kw_only=True)
class ReplicaSpec:
    """How a replica is built: what a supervisor needs to start it again.

    Attributes:
        factory: Builds the replica (``factory(replica_id, **options)``, or whatever the
            runtime's convention is; core never calls it).
        options: Keyword arguments of ``factory`` (copied).
    """

    factory: Callable[..., Any] = attrs.field(validator=attrs.validators.is_callable())
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)


@attrs.frozen
class ReplicaMember:
    """A member of a `ReplicaSet`, as seen at one moment.

    Attributes:
        replica_id: The replica's id.
        role: ``"standalone"`` or ``"hybrid"``.
        alive: False once the replica was marked dead.
        routable: In the router's routable set (always False for a dead member).
        placement: Where it runs (None when the runtime gave no record).
        spec: How it is built (None when the runtime gave no record).
        replica: The member's replica object (the dead one, for a dead member).
    """

    replica_id: str
    role: ReplicaRole
    alive: bool
    routable: bool
    placement: ReplicaPlacement | None = None
    spec: ReplicaSpec | None = None
    replica: RolloutReplica | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class MembershipEvent:
    """One change of a `ReplicaSet`, delivered to its subscribers (and its event bus).

    Attributes:
        time: Loop time of the change (NaN for a change made outside a running loop).
        kind: ``added``, ``removed``, ``died``, ``routed`` or ``unrouted``.
        replica_ids: The replicas the change concerns, sorted.
        routable: The live routable replicas after the change, sorted.
        routable_changed: The routable set differs from the one before the change.
    """

    time: float
    kind: MembershipKind
    replica_ids: tuple[str, ...]
    routable: tuple[str, ...]
    routable_changed: bool


MembershipListener = Callable[[MembershipEvent], None]


@attrs.define
class _Member:
    replica: RolloutReplica
    role: ReplicaRole
    placement: ReplicaPlacement | None = None
    spec: ReplicaSpec | None = None
    alive: bool = True
    routable: bool = False

    def view(self, replica_id: str) -> ReplicaMember:
        return ReplicaMember(
            replica_id,
            self.role,
            self.alive,
            self.alive and self.routable,
            self.placement,
            self.spec,
            self.replica,
        )


class ReplicaSet(Mapping[str, RolloutReplica]):
    """The replicas of a run, with their role, liveness and routability.

    As a mapping it holds the *live* replicas by id (``replicas.get(rid)`` is None for an
    unknown or dead one). Routability changes are async because they go through the
    router first; membership and liveness changes are synchronous.

    Args:
        router: The router that follows the set (default: a new `LoadBalancer`).
        standalone: Standalone replicas (always routable while alive, once routed).
        hybrid: Hybrid replicas (routed only while the controller has them active).
        clock: Time source of the change events (default: the running loop).
        events: Bus that also receives every `MembershipEvent`.

    Raises:
        ValueError: two replicas share an id.

    Example:
        >>> import asyncio
        >>> from dynsched_core import InMemoryReplica
        >>> async def demo() -> tuple[list[str], list[str], list[str]]:
        ...     replicas = ReplicaSet(standalone=[InMemoryReplica("s0"), InMemoryReplica("s1")],
        ...                           hybrid=[InMemoryReplica("h0", role="hybrid")])
        ...     await replicas.route(replicas.standalone_ids)
        ...     replicas.mark_dead("s1")  # every reader drops it now ...
        ...     await replicas.settle(timeout_s=1.0)  # ... and the router right after
        ...     return replicas.routable_ids, await replicas.router.routable(), sorted(replicas)
        >>> asyncio.run(demo())
        (['s0'], ['s0'], ['h0', 's0'])
    """

    def __init__(
        self,
        router: Router | None = None,
        *,
        standalone: Iterable[RolloutReplica] | Mapping[str, RolloutReplica] = (),
        hybrid: Iterable[RolloutReplica] | Mapping[str, RolloutReplica] = (),
        clock: Clock | None = None,
        events: EventBus | None = None,
    ) -> None:
        self._router: Router = router if router is not None else LoadBalancer()
        self._clock: Clock = clock if clock is not None else LoopClock()
        self._events = events
        self._members: dict[str, _Member] = {}
        self._deaths: list[str] = []
        self._listeners: list[MembershipListener] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._stale: list[str] = []
        self.version = 0
        for role, group in (("standalone", standalone), ("hybrid", hybrid)):
            values = group.values() if isinstance(group, Mapping) else group
            for replica in values:
                self._insert(replica, role)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ Mapping
    def __getitem__(self, replica_id: str) -> RolloutReplica:
        member = self._members.get(replica_id)
        if member is None or not member.alive:
            raise KeyError(replica_id)
        return member.replica

    def __iter__(self) -> Iterator[str]:
        return iter([rid for rid, m in self._members.items() if m.alive])

    def __len__(self) -> int:
        return sum(1 for m in self._members.values() if m.alive)

    def __contains__(self, replica_id: object) -> bool:
        member = self._members.get(replica_id) if isinstance(replica_id, str) else None
        return member is not None and member.alive

    def get(self, replica_id: str, default: RolloutReplica | None = None) -> RolloutReplica | None:  # type: ignore[override]
        """The live replica ``replica_id`` (``default`` when unknown or dead)."""
        member = self._members.get(replica_id)
        if member is None or not member.alive:
            return default
        return member.replica

    # ------------------------------------------------------------------ reading
    @property
    def router(self) -> Router:
        """The router that follows this set."""
        return self._router

    def ids(self, role: ReplicaRole | None = None, *, routable: bool | None = None) -> list[str]:
        """Ids of the live members (of ``role``; routable or not when given), sorted."""
        return sorted(
            rid
            for rid, m in self._members.items()
            if m.alive
            and (role is None or m.role == role)
            and (routable is None or m.routable == routable)
        )

    def of_role(self, role: ReplicaRole) -> list[RolloutReplica]:
        """The live replicas of ``role``, sorted by id."""
        return [self._members[rid].replica for rid in self.ids(role)]

    @property
    def standalone_ids(self) -> list[str]:
        """Ids of the live standalone replicas, sorted."""
        return self.ids("standalone")

    @property
    def hybrid_ids(self) -> list[str]:
        """Ids of the live hybrid replicas, sorted."""
        return self.ids("hybrid")

    @property
    def routable_ids(self) -> list[str]:
        """Ids of the live routable replicas, sorted."""
        return self.ids(routable=True)

    @property
    def num_standalone(self) -> int:
        """Live standalone replicas."""
        return self._count("standalone")

    @property
    def num_hybrid(self) -> int:
        """Live hybrid replicas."""
        return self._count("hybrid")

    @property
    def num_routable(self) -> int:
        """Live routable replicas."""
        return sum(1 for m in self._members.values() if m.alive and m.routable)

    @property
    def dead_ids(self) -> list[str]:
        """Members marked dead (and not replaced since), in the order of their deaths."""
        return [
            rid for rid in self._deaths if rid in self._members and not self._members[rid].alive
        ]

    def role_of(self, replica_id: str) -> ReplicaRole:
        """The role of member ``replica_id`` (alive or dead).

        Raises:
            KeyError: not a member.
        """
        return self._member(replica_id).role

    def is_alive(self, replica_id: str) -> bool:
        """True for a live member (False for a dead or unknown one)."""
        member = self._members.get(replica_id)
        return member is not None and member.alive

    def is_routable(self, replica_id: str) -> bool:
        """True for a live member in the router's routable set."""
        member = self._members.get(replica_id)
        return member is not None and member.alive and member.routable

    def members(self) -> list[ReplicaMember]:
        """Every member (dead ones included), sorted by id."""
        return [m.view(rid) for rid, m in sorted(self._members.items())]

    def member(self, replica_id: str) -> ReplicaMember:
        """Member ``replica_id`` (alive or dead) with its record.

        Raises:
            KeyError: not a member.
        """
        return self._member(replica_id).view(replica_id)

    def placement_of(self, replica_id: str) -> ReplicaPlacement:
        """Where member ``replica_id`` (alive or dead) runs.

        Raises:
            KeyError: not a member, or a member without a placement record.
        """
        placement = self._member(replica_id).placement
        if placement is None:
            raise KeyError(f"replica {replica_id!r} has no placement record")
        return placement

    def subscribe(self, listener: MembershipListener) -> Callable[[], None]:
        """Call ``listener(event)`` after every change; returns a function that unsubscribes.

        Listeners run synchronously in subscription order; one that raises is logged and
        the others still run.
        """
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {listener!r}")
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    # ------------------------------------------------------------------ membership
    def add(
        self,
        replica: RolloutReplica,
        role: ReplicaRole | None = None,
        *,
        placement: ReplicaPlacement | None = None,
        spec: ReplicaSpec | None = None,
    ) -> None:
        """Make ``replica`` a live member, not routable yet (`route` it to serve).

        A dead member's id may be taken by a fresh replica (a restarted engine); it keeps
        the dead member's placement and spec unless given new ones.

        Args:
            replica: The replica.
            role: ``"standalone"`` or ``"hybrid"`` (default: its capabilities' role).
            placement: Where it runs.
            spec: How it is built.

        Raises:
            ValueError: a live member already has its id, the role is unknown, or a live
                member of the same pool already sits on one of its GPUs.
        """
        rid = self._insert(replica, role, placement, spec)
        self._publish("added", [rid], routable_changed=False)

    def set_record(
        self,
        replica_id: str,
        *,
        placement: ReplicaPlacement | None = None,
        spec: ReplicaSpec | None = None,
    ) -> None:
        """Record where a member runs and how it is built (for a set assembled before the
        runtime knew it; a None argument leaves that part as it is).

        Raises:
            KeyError: not a member.
            ValueError: a live member of the same pool already sits on one of its GPUs.
        """
        member = self._member(replica_id)
        if placement is not None:
            if member.alive:
                self._check_gpus(replica_id, placement)
            member.placement = placement
        if spec is not None:
            member.spec = spec

    async def remove(self, replica_id: str) -> bool:
        """Forget a member for good (taking it out of routing first).

        Returns:
            True when it was a member.
        """
        member = self._members.get(replica_id)
        if member is None:
            return False
        if member.routable:
            await self.unroute([replica_id])
        if self._members.pop(replica_id, None) is None:
            return False
        self._publish("removed", [replica_id], routable_changed=False)
        return True

    def mark_dead(self, replica_id: str) -> bool:
        """Record that a member's engine died: it stops counting at once.

        It leaves the live views (mapping, counts, routable set) immediately; its removal
        from the router follows in the background (awaitable with `settle`).

        Returns:
            True when a live member died, False when unknown or already dead.
        """
        member = self._members.get(replica_id)
        if member is None or not member.alive:
            return False
        was_routable = member.routable
        member.alive = False
        member.routable = False
        self._deaths.append(replica_id)
        logger.info("replica %s (%s) marked dead", replica_id, member.role)
        if was_routable:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called from synchronous code: `settle` catches up
                self._stale.append(replica_id)
            else:
                task = loop.create_task(
                    self._unroute_dead(replica_id), name=f"unroute-{replica_id}"
                )
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
        self._publish("died", [replica_id], routable_changed=was_routable)
        return True

    async def settle(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) until the router caught up with the deaths recorded so far."""
        stale, self._stale = self._stale, []
        for replica_id in stale:
            await asyncio.wait_for(self._unroute_dead(replica_id), timeout_s)
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    # ------------------------------------------------------------------ routing
    async def route(self, replica_ids: Sequence[str]) -> None:
        """Make live members routable: the router first, then this set.

        Dead members in ``replica_ids`` are skipped (a dead replica is never exposed).

        Raises:
            KeyError: an id is not a member.
            Exception: whatever the router raised (nothing is recorded then).
        """
        ids = [rid for rid in replica_ids if self._member(rid).alive]
        if not ids:
            return
        await self._router.add_replicas(ids)
        self._set_routable(ids, True)

    async def unroute(self, replica_ids: Sequence[str]) -> None:
        """Take members (live or dead) out of routing: the router first, then this set.

        Raises:
            KeyError: an id is not a member.
            Exception: whatever the router raised (nothing is recorded then).
        """
        ids = list(replica_ids)
        for rid in ids:
            self._member(rid)
        if not ids:
            return
        await self._router.remove_replicas(ids)
        self._set_routable(ids, False)

    # ------------------------------------------------------------------ internals
    def _member(self, replica_id: str) -> _Member:
        member = self._members.get(replica_id)
        if member is None:
            raise KeyError(
                f"replica {replica_id!r} is not a member of this ReplicaSet"
                f" (members: {sorted(self._members)})"
            )
        return member

    def _count(self, role: ReplicaRole) -> int:
        return sum(1 for m in self._members.values() if m.alive and m.role == role)

    def _insert(
        self,
        replica: RolloutReplica,
        role: ReplicaRole | None,
        placement: ReplicaPlacement | None = None,
        spec: ReplicaSpec | None = None,
    ) -> str:
        rid = replica.replica_id
        if role is None:
            role = replica.capabilities.role
        if role not in ROLES:
            raise ValueError(f"role of replica {rid!r} must be one of {list(ROLES)}, got {role!r}")
        existing = self._members.get(rid)
        if existing is not None and existing.alive:
            raise ValueError(f"duplicate replica id {rid!r}: a live member already has it")
        if existing is not None:  # a fresh replica takes a dead member's place and record
            placement = placement if placement is not None else existing.placement
            spec = spec if spec is not None else existing.spec
        if placement is not None:
            self._check_gpus(rid, placement)
        if existing is not None:
            del self._members[rid]
            self._deaths.remove(rid)
        self._members[rid] = _Member(replica, role, placement, spec)
        return rid

    def _check_gpus(self, replica_id: str, placement: ReplicaPlacement) -> None:
        """No two live members of one pool sit on the same GPU."""
        wanted = set(placement.gpu_ids)
        for rid, m in self._members.items():
            if rid == replica_id or not m.alive or m.placement is None:
                continue
            if m.placement.pool == placement.pool and wanted & set(m.placement.gpu_ids):
                shared = sorted(wanted & set(m.placement.gpu_ids))
                raise ValueError(
                    f"replica {replica_id!r} cannot sit on GPU(s) {shared} of pool"
                    f" {placement.pool!r}: live member {rid!r} already does"
                )

    def _set_routable(self, ids: Sequence[str], routable: bool) -> None:
        changed = []
        for rid in ids:
            member = self._members.get(rid)
            if member is None:
                continue
            value = routable and member.alive
            if member.routable != value:
                member.routable = value
                changed.append(rid)
        if changed:
            self._publish("routed" if routable else "unrouted", changed, routable_changed=True)

    async def _unroute_dead(self, replica_id: str, attempts: int = 3) -> None:
        for attempt in range(1, attempts + 1):
            try:
                await self._router.remove_replicas([replica_id])
                return
            except Exception as exc:
                logger.warning(
                    "could not remove dead replica %s from routing (attempt %d/%d): %r",
                    replica_id,
                    attempt,
                    attempts,
                    exc,
                )
            if attempt < attempts:
                await asyncio.sleep(0.05 * attempt)

    def _publish(self, kind: MembershipKind, ids: Sequence[str], *, routable_changed: bool) -> None:
        self.version += 1
        try:
            now = self._clock.now()
        except RuntimeError:  # a change made from synchronous code, no event loop around
            now = math.nan
        event = MembershipEvent(
            time=now,
            kind=kind,
            replica_ids=tuple(sorted(ids)),
            routable=tuple(self.routable_ids),
            routable_changed=routable_changed,
        )
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("replica set listener %r failed on %r", listener, event)
        if self._events is not None:
            self._events.emit(event)

    def __repr__(self) -> str:
        return (
            f"ReplicaSet(standalone={self.standalone_ids}, hybrid={self.hybrid_ids},"
            f" routable={self.routable_ids}, dead={self._deaths})"
        )


class MembershipFollower:
    """Base of the parts that follow a `ReplicaSet` (the client, the controller, the
    rollouter): it checks and keeps the set and the clock, and subscribes the part's
    ``_on_membership`` when the part calls `_follow` at the end of its constructor.

    Args:
        replicas: The set followed (a `TypeError` naming ``replicas`` otherwise).
        clock: Time source (default: the running loop).
    """

    def __init__(self, replicas: ReplicaSet, clock: Clock | None) -> None:
        self._replicas = v.expect_instance("replicas", replicas, ReplicaSet, by_type=True)
        self._clock: Clock = clock if clock is not None else LoopClock()

    @property
    def replicas(self) -> ReplicaSet:
        """The `ReplicaSet` this part follows (its router is ``replicas.router``)."""
        return self._replicas

    def _follow(self) -> None:
        """Subscribe `_on_membership` (once the part's own state is built)."""
        self._replicas.subscribe(self._on_membership)

    def _on_membership(self, event: MembershipEvent) -> None:
        """React to one membership change (each part its own way)."""
        raise NotImplementedError
