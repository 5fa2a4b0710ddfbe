"""`DynamicResourceController`: switches hybrid replicas between rollout and training.

The controller owns the hybrid lifecycle. Its `HybridStateMachine` is the single source
of truth of whether hybrid replicas serve; which hybrid replicas exist, live and are
routable is the `ReplicaSet`'s to know (the controller switches its live hybrid members
and routes them through it), and `DynamicResourceController.reconcile` brings the router
back in line with the state. When the last live hybrid replica of an active set dies the
state returns to ``STANDALONE_ONLY`` by itself.

Deactivation, order critical:
  1. ``remove_from_routing`` — no request (new or retried) can land on a hybrid replica;
  2. ``abort`` — in-flight requests return; the retrying client resumes them elsewhere;
  3. ``sleep`` — KV cache released, weights offloaded, GPU memory back to training.

Activation, after the weight sync of a cycle (or at any step boundary: a replica woken
mid-cycle loads the current weights from its own trainer GPU), of every live hybrid
replica or of the ``replica_ids`` chosen (partial lending, k of m):
  1. ``wake_up`` then ``update_weights`` — the hybrid weight sync (skipped entirely when
     the policy does not activate: the driver simply does not call `activate`);
  2. ``resume``;
  3. ``add_to_routing`` — never expose a replica that cannot serve;
  4. optional ``rebalance`` — clear sticky sessions and move only the *excess* in-flight
     requests of overloaded replicas (not every request everywhere).

Any failing step leaves the system safe: hybrid replicas out of routing, aborted and
asleep (a sleep that fails is retried ``sleep_attempts`` times; a replica that still
cannot sleep is taken out of the run, marked dead), state ``STANDALONE_ONLY``, and a
`SwitchError` naming the step. So while the state says ``STANDALONE_ONLY`` every live
hybrid replica is asleep. Switch requests never interleave: they are serialised (in
request order) by one lock. Every awaited replica/router call is bounded by
``call_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import attrs

from dynsched_core import validators as v
from dynsched_core._clock import Clock
from dynsched_core._errors import SwitchError
from dynsched_core._events import EventBus, SwitchEvent, TransitionEvent
from dynsched_core._protocols import RolloutReplica
from dynsched_core._replicas import MembershipEvent, MembershipFollower, ReplicaSet
from dynsched_core._state import HybridState, HybridStateMachine, Transition

__all__ = ["ControllerOptions", "DynamicResourceController", "RebalanceReport", "SwitchStep"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SwitchStep = Literal[
    "remove_from_routing",
    "abort",
    "sleep",
    "wake_up",
    "update_weights",
    "resume",
    "add_to_routing",
    "rebalance",
]

_S = HybridState


@runtime_checkable
class _ListsRequests(Protocol):
    def requests_on(self, replica_id: str) -> list[str]: ...


@attrs.frozen(kw_only=True)
class RebalanceReport:
    """What a rebalance did.

    Attributes:
        moved: Requests aborted on overloaded replicas so that the retrying client
            re-routes them by least load (their re-prefill cost shows up in the
            client's ``reprefill_tokens``).
        in_flight_before: In-flight requests per routable replica before the rebalance.
        target_share: Balanced share per replica, ``ceil(total / routable)``.
        aborted: Requests aborted per replica (only replicas above the share appear).
        start: Loop time when the rebalance started.
        end: Loop time when it ended.
    """

    moved: int = 0
    in_flight_before: Mapping[str, int] = attrs.field(factory=dict)
    target_share: int = 0
    aborted: Mapping[str, int] = attrs.field(factory=dict)
    start: float = 0.0
    end: float = 0.0

    @property
    def duration_s(self) -> float:
        """``end - start``."""
        return self.end - self.start


class _StepFailed(Exception):
    def __init__(self, step: SwitchStep, replica_id: str | None, cause: BaseException) -> None:
        super().__init__(step, replica_id, cause)
        self.step = step
        self.replica_id = replica_id
        self.cause = cause


@attrs.frozen(kw_only=True)
class ControllerOptions:
    """Settings of a `DynamicResourceController`.

    Attributes:
        call_timeout_s: Bound of every awaited replica/router call (> 0).
        sleep_attempts: Tries at putting a hybrid replica back to sleep after a failed
            switch (>= 1). A replica still awake after them is taken out of the run
            (marked dead in the `ReplicaSet`, so a supervisor replaces its engine): in
            ``STANDALONE_ONLY`` no live hybrid replica is ever awake.
    """

    call_timeout_s: float = attrs.field(default=120.0, validator=v.float_gt(0.0))
    sleep_attempts: int = attrs.field(default=3, validator=v.int_ge(1))


class DynamicResourceController(MembershipFollower):
    """Activates and deactivates the hybrid members of a `ReplicaSet`.

    Args:
        replicas: The replicas of the run; the controller switches its live hybrid
            members, routes them through it and, in `rebalance`, aborts excess requests on
            any member.
        options: Settings (default: `ControllerOptions()`).
        state_machine: The lifecycle state (default: a new one starting in
            ``STANDALONE_ONLY``, timed by ``clock``).
        clock: Time source for durations and events (default: the running loop).
        events: Bus receiving `SwitchEvent` and `TransitionEvent`.

    Example:
        >>> import asyncio
        >>> from dynsched_core import InMemoryReplica, ReplicaSet
        >>> async def demo() -> tuple[bool, list[str]]:
        ...     replicas = ReplicaSet(standalone=[InMemoryReplica("s0")],
        ...                           hybrid=[InMemoryReplica("h0", role="hybrid")])
        ...     await replicas.route(["s0"])
        ...     ctrl = DynamicResourceController(replicas)
        ...     await ctrl.activate(version=1)
        ...     return ctrl.is_hybrid_active, await replicas.router.routable()
        >>> asyncio.run(demo())
        (True, ['h0', 's0'])
    """

    def __init__(
        self,
        replicas: ReplicaSet,
        options: ControllerOptions | None = None,
        *,
        state_machine: HybridStateMachine | None = None,
        clock: Clock | None = None,
        events: EventBus | None = None,
    ) -> None:
        super().__init__(replicas, clock)
        self.options = v.options_or_default(options, ControllerOptions)
        self._events = events
        self._sm = state_machine if state_machine is not None else HybridStateMachine(self._clock)
        self._sm.add_listener(self._on_transition)
        self.call_timeout_s = self.options.call_timeout_s
        self._lock = asyncio.Lock()
        self._hybrid_version: int | None = None
        self._active: tuple[str, ...] = ()
        self.activate_count = 0
        self.deactivate_count = 0
        self.failure_count = 0
        self.last_activate_duration_s = 0.0
        self.last_deactivate_duration_s = 0.0
        self.last_rebalance: RebalanceReport | None = None
        self.last_error: SwitchError | None = None
        self._follow()

    # ------------------------------------------------------------------ properties
    @property
    def state(self) -> HybridState:
        """Current lifecycle state."""
        return self._sm.state

    @property
    def state_machine(self) -> HybridStateMachine:
        """The state machine (add listeners here for metrics/logs)."""
        return self._sm

    @property
    def is_hybrid_active(self) -> bool:
        """True in ``HYBRID_ACTIVE`` (hybrid replicas routable and generating)."""
        return self._sm.is_hybrid_active

    @property
    def hybrid_ids(self) -> tuple[str, ...]:
        """Ids of the live hybrid replicas, sorted."""
        return tuple(self._replicas.hybrid_ids)

    @property
    def active_hybrid_ids(self) -> tuple[str, ...]:
        """Ids of the live hybrid replicas lent to rollout now (empty unless ``HYBRID_ACTIVE``).

        Every live hybrid replica after a full activation; the ``replica_ids`` chosen
        after a partial one.
        """
        if self._sm.state is not _S.HYBRID_ACTIVE:
            return ()
        live = set(self._replicas.hybrid_ids)
        return tuple(rid for rid in self._active if rid in live)

    @property
    def has_hybrid_replicas(self) -> bool:
        """False when there is nothing to switch (every call is then a no-op)."""
        return self._replicas.num_hybrid > 0

    @property
    def hybrid_gpus(self) -> int:
        """GPUs of the live hybrid replicas (from their capabilities)."""
        return sum(r.capabilities.num_gpus for r in self._replicas.of_role("hybrid"))

    @property
    def hybrid_weights_version(self) -> int | None:
        """Weight version last loaded into the hybrid replicas (None before any)."""
        return self._hybrid_version

    # ------------------------------------------------------------------ switches
    async def activate(
        self,
        version: int,
        weights: Any = None,
        rebalance: bool = False,
        *,
        replica_ids: Sequence[str] | None = None,
    ) -> bool:
        """Wake, sync weights, resume and route the hybrid replicas (optionally rebalance).

        Idempotent: when already active with ``version`` nothing happens; when active with
        older weights, the weights of the active replicas are refreshed in place (out of
        routing, abort, update, resume, back in routing).

        Args:
            version: Weight version to load.
            weights: Forwarded to ``update_weights`` (None: the replica loads ``version``
                from its own trainer GPU).
            rebalance: Rebalance in-flight requests after routing.
            replica_ids: Partial lending: activate only these live hybrid replicas (k of
                m); None (default) activates every live one. Ignored when already active.

        Returns:
            True when a switch (or weight refresh) happened, False for a no-op.

        Raises:
            SwitchError: a step failed; the hybrid replicas are out of routing and the
                state is ``STANDALONE_ONLY``.
            ValueError: ``replica_ids`` is empty or names a replica that is not a live
                hybrid member.
        """
        if not self.has_hybrid_replicas:
            return False
        async with self._settled():
            if self._sm.state is _S.HYBRID_ACTIVE:
                return await self._sync_active(version, weights)
            ids = self._chosen(replica_ids)
            self._active = tuple(ids)
            start = self._clock.now()
            self._sm.transition(_S.ACTIVATING, reason=f"activate v{version}")
            try:
                await self._activation_steps(ids, version, weights)
                if rebalance:
                    self.last_rebalance = await self._rebalance_steps()
            except _StepFailed as failed:
                raise await self._fail("activate", ids, failed, start) from failed.cause
            self._sm.transition(_S.HYBRID_ACTIVE, reason=f"activated v{version}")
            self._drop_if_all_lost()
            self.activate_count += 1
            end = self._clock.now()
            self.last_activate_duration_s = end - start
            detail = f"version={version}"
            if replica_ids is not None:
                detail += f" replicas={len(ids)}/{len(self.hybrid_ids)}"
            self._emit_switch("activate", start, True, detail, end=end)
            return True

    def _chosen(self, replica_ids: Sequence[str] | None) -> tuple[str, ...]:
        """The hybrid replicas an activation switches: all live ones, or a checked subset."""
        if replica_ids is None:
            return self.hybrid_ids
        if isinstance(replica_ids, str):
            raise TypeError(f"replica_ids must be a sequence of ids, got {replica_ids!r}")
        chosen = sorted(set(replica_ids))
        live = set(self.hybrid_ids)
        unknown = [rid for rid in chosen if rid not in live]
        if not chosen or unknown:
            raise ValueError(
                f"replica_ids must name live hybrid replicas, got {list(replica_ids)!r} "
                f"(unknown or dead: {unknown}); live hybrid replicas: {sorted(live)}"
            )
        return tuple(chosen)

    async def deactivate(self) -> bool:
        """Remove hybrid replicas from routing, abort their requests, put them to sleep.

        Idempotent: a no-op unless hybrid replicas are active.

        Returns:
            True when a switch happened.

        Raises:
            SwitchError: a step failed; the hybrid replicas are out of routing and the
                state is ``STANDALONE_ONLY``.
        """
        if not self.has_hybrid_replicas:
            return False
        async with self._settled():
            if self._sm.state is not _S.HYBRID_ACTIVE:
                return False
            ids = self.active_hybrid_ids
            start = self._clock.now()
            self._sm.transition(_S.DEACTIVATING, reason="deactivate")
            try:
                await self._deactivation_steps(ids)
            except _StepFailed as failed:
                raise await self._fail("deactivate", ids, failed, start) from failed.cause
            self._sm.transition(_S.STANDALONE_ONLY, reason="deactivated")
            self.deactivate_count += 1
            end = self._clock.now()
            self.last_deactivate_duration_s = end - start
            self._emit_switch("deactivate", start, True, end=end)
            return True

    async def sync_hybrid_weights(self, version: int, weights: Any = None) -> bool:
        """Bring active hybrid replicas to ``version`` (verl's name for the hybrid sync).

        Asleep hybrid replicas are not touched: their weights are synced by the next
        `activate` (this is how the sync is skipped when the policy does not activate).

        Returns:
            True when weights were pushed.

        Raises:
            SwitchError: a step failed (safe state restored).
        """
        if not self.has_hybrid_replicas:
            return False
        async with self._settled():
            if self._sm.state is not _S.HYBRID_ACTIVE:
                return False
            return await self._sync_active(version, weights)

    async def _sync_active(self, version: int, weights: Any) -> bool:
        """In ``HYBRID_ACTIVE``, under the lock: push ``version`` to the lent replicas
        unless they hold it already (True when weights were pushed)."""
        if self._hybrid_version == version:
            return False
        await self._timed(
            "hybrid_weight_sync", self._refresh_weights(self.active_hybrid_ids, version, weights)
        )
        return True

    async def rebalance(self) -> RebalanceReport:
        """Clear sticky sessions and abort the excess in-flight requests of overloaded replicas.

        A replica is overloaded when it holds more than ``ceil(total / routable)``
        requests; only the excess is aborted (the retrying client resumes those requests
        by least load, i.e. mostly on the replicas that just joined).

        Raises:
            SwitchError: a step failed (the safe state is restored first).
        """
        async with self._lock:
            start = self._clock.now()
            try:
                report = await self._rebalance_steps()
            except _StepFailed as failed:
                raise await self._fail(
                    "rebalance", self.hybrid_ids, failed, start
                ) from failed.cause
            self.last_rebalance = report
            return report

    async def reconcile(self) -> list[str]:
        """Make the router agree with the state and the membership; return the ids fixed.

        In ``STANDALONE_ONLY`` no hybrid replica may be routable; in ``HYBRID_ACTIVE``
        every lent live hybrid replica must be (`active_hybrid_ids`: all of them unless
        the activation was partial) and no other; a dead member never is. A transitional state
        left behind by a cancelled switch is resolved to ``STANDALONE_ONLY`` first. The
        router's own routable set is read, so a router that lost or kept routes behind
        the `ReplicaSet`'s back (a reused router actor) is brought back in line.
        """
        async with self._settled():
            self._drop_if_all_lost()
            routable = set(await self._bounded(self._replicas.router.routable()))
            dead = [m.replica_id for m in self._replicas.members() if not m.alive]
            stale = [rid for rid in dead if rid in routable]
            if stale:
                await self._bounded(self._replicas.unroute(stale))
            if self._sm.state is _S.HYBRID_ACTIVE:
                active = set(self.active_hybrid_ids)
                fix = [rid for rid in self.hybrid_ids if rid in active and rid not in routable]
                if fix:
                    await self._bounded(self._replicas.route(fix))
                idle = [rid for rid in self.hybrid_ids if rid not in active and rid in routable]
                if idle:  # partial lending: a hybrid replica not lent is never routable
                    await self._bounded(self._replicas.unroute(idle))
                    fix += idle
            else:
                fix = [rid for rid in self.hybrid_ids if rid in routable]
                if fix:
                    await self._bounded(self._replicas.unroute(fix))
            if fix or stale:
                logger.warning(
                    "reconcile: routing of %s disagreed with state %s", fix + stale, self.state
                )
            return fix + stale

    # ------------------------------------------------------------------ steps
    async def _deactivation_steps(self, ids: Sequence[str]) -> None:
        await self._router_step("remove_from_routing", lambda: self._replicas.unroute(ids))
        await self._each(ids, "abort", lambda r: r.abort(None))
        await self._each(ids, "sleep", lambda r: r.sleep())

    async def _activation_steps(self, ids: Sequence[str], version: int, weights: Any) -> None:
        await self._each(ids, "wake_up", lambda r: r.wake_up())
        await self._each(ids, "update_weights", lambda r: r.update_weights(version, weights))
        self._hybrid_version = version
        await self._each(ids, "resume", lambda r: r.resume())
        await self._router_step("add_to_routing", lambda: self._replicas.route(ids))

    async def _refresh_weights(self, ids: Sequence[str], version: int, weights: Any) -> None:
        try:
            await self._router_step("remove_from_routing", lambda: self._replicas.unroute(ids))
            await self._each(ids, "abort", lambda r: r.abort(None))
            await self._each(ids, "update_weights", lambda r: r.update_weights(version, weights))
            self._hybrid_version = version
            await self._each(ids, "resume", lambda r: r.resume())
            await self._router_step("add_to_routing", lambda: self._replicas.route(ids))
        except _StepFailed as failed:
            start = self._clock.now()
            raise await self._fail("sync_weights", ids, failed, start) from failed.cause

    async def _rebalance_steps(self) -> RebalanceReport:
        start = self._clock.now()
        try:
            counts = dict(await self._bounded(self._replicas.router.in_flight_counts()))
            await self._bounded(self._replicas.router.clear_sticky())
        except Exception as exc:
            raise _StepFailed("rebalance", None, exc) from exc
        total = sum(counts.values())
        share = math.ceil(total / len(counts)) if counts else 0
        aborted: dict[str, int] = {}
        for rid, count in sorted(counts.items()):
            if count <= share:
                continue
            aborted[rid] = await self._abort_excess(rid, count - share)
        report = RebalanceReport(
            moved=sum(aborted.values()),
            in_flight_before=counts,
            target_share=share,
            aborted=aborted,
            start=start,
            end=self._clock.now(),
        )
        self._emit_switch(
            "rebalance", start, True, f"moved={report.moved} share={share} before={counts}"
        )
        logger.info(
            "rebalance moved %d request(s) (share %d, before %s)", report.moved, share, counts
        )
        return report

    async def _abort_excess(self, replica_id: str, excess: int) -> int:
        replica = self._replicas.get(replica_id)
        if replica is None:
            logger.warning("rebalance: replica %s is routable but unknown; skipped", replica_id)
            return 0
        ids: list[str] | None = None
        if isinstance(self._replicas.router, _ListsRequests):
            ids = sorted(self._replicas.router.requests_on(replica_id))[-excess:]
        try:
            aborted = await self._bounded(replica.abort(ids))
        except Exception as exc:
            raise _StepFailed("rebalance", replica_id, exc) from exc
        return int(aborted)

    # ------------------------------------------------------------------ plumbing
    async def _bounded(self, awaitable: Awaitable[T]) -> T:
        return await asyncio.wait_for(awaitable, self.call_timeout_s)

    async def _router_step(self, step: SwitchStep, call: Callable[[], Awaitable[None]]) -> None:
        try:
            await self._bounded(call())
        except Exception as exc:
            raise _StepFailed(step, None, exc) from exc

    async def _each(
        self,
        ids: Sequence[str],
        step: SwitchStep,
        call: Callable[[RolloutReplica], Awaitable[Any]],
    ) -> None:
        """Run ``call`` on every replica of ``ids`` concurrently; fail on the first error.

        A replica that died since the switch started fails its step.
        """
        # each task builds its own call when it starts: a task cancelled before it runs (Ctrl-C
        # at the wrong moment) then leaves no never-awaited coroutine behind
        results = await asyncio.gather(
            *(self._bounded_call_on(rid, call) for rid in ids), return_exceptions=True
        )
        for rid, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                raise _StepFailed(step, rid, result)

    async def _bounded_call_on(
        self, replica_id: str, call: Callable[[RolloutReplica], Awaitable[T]]
    ) -> T:
        return await self._bounded(self._call_on(replica_id, call))

    async def _call_on(self, replica_id: str, call: Callable[[RolloutReplica], Awaitable[T]]) -> T:
        replica = self._replicas.get(replica_id)
        if replica is None:
            raise RuntimeError(f"replica {replica_id!r} died during the switch")
        return await call(replica)

    async def _fail(
        self, operation: str, ids: Sequence[str], failed: _StepFailed, start: float
    ) -> SwitchError:
        """Restore the safe state after ``failed`` and return the error to raise."""
        await self._make_safe(ids)
        if self._sm.state is _S.HYBRID_ACTIVE:
            self._sm.transition(_S.DEACTIVATING, reason=f"{operation} failed at {failed.step}")
        if self._sm.state is not _S.STANDALONE_ONLY:
            self._sm.transition(_S.STANDALONE_ONLY, reason=f"{operation} failed at {failed.step}")
        self.failure_count += 1
        error = SwitchError(operation, failed.step, failed.replica_id, failed.cause)
        self.last_error = error
        kind: Literal["activate", "deactivate", "rebalance", "hybrid_weight_sync"] = (
            "hybrid_weight_sync" if operation == "sync_weights" else operation  # type: ignore[assignment]
        )
        self._emit_switch(kind, start, False, str(error))
        logger.error("%s; hybrid replicas are out of routing (STANDALONE_ONLY)", error)
        return error

    async def _make_safe(self, ids: Sequence[str] | None = None) -> None:
        """Hybrid out of routing, aborted, asleep; errors are logged, never raised.

        ``ids``: the hybrid replicas of the failed switch (default: the live ones); dead
        ones are taken out of routing and otherwise left alone. A replica whose sleep
        still fails after ``sleep_attempts`` tries is marked dead in the `ReplicaSet`
        (out of routing and of the run; a supervisor restarts a fresh, asleep engine):
        the state may then honestly say ``STANDALONE_ONLY``.
        """
        ids = list(self.hybrid_ids if ids is None else ids)
        try:
            await self._bounded(self._replicas.unroute(ids))
        except Exception:
            logger.exception("safe state: could not remove hybrid replicas %s from routing", ids)
        for rid in ids:
            replica = self._replicas.get(rid)
            if replica is None:
                continue
            try:
                await self._bounded(replica.abort(None))
            except Exception as exc:
                logger.warning("safe state: abort on hybrid replica %s failed: %r", rid, exc)
            await self._sleep_or_retire(rid, replica)

    async def _sleep_or_retire(self, rid: str, replica: RolloutReplica) -> None:
        """Put ``replica`` to sleep (``sleep_attempts`` tries) or take it out of the run."""
        error: BaseException | None = None
        for attempt in range(1, self.options.sleep_attempts + 1):
            try:
                await self._bounded(replica.sleep())
                return
            except Exception as exc:
                error = exc
                logger.warning(
                    "safe state: sleep on hybrid replica %s failed (attempt %d/%d): %r",
                    rid,
                    attempt,
                    self.options.sleep_attempts,
                    exc,
                )
            if self._replicas.get(rid) is None:  # died meanwhile
                return
        logger.error(
            "safe state: hybrid replica %s cannot be put to sleep (%r); taking it out of the"
            " run (marked dead) so that no awake hybrid engine shares the trainer's GPUs",
            rid,
            error,
        )
        self._replicas.mark_dead(rid)

    @contextlib.asynccontextmanager
    async def _settled(self) -> AsyncIterator[None]:
        """Hold the switch lock, with a transition an error interrupted recovered first."""
        async with self._lock:
            await self._recover_transitional()
            yield

    async def _recover_transitional(self) -> None:
        if self._sm.state in (_S.ACTIVATING, _S.DEACTIVATING):
            logger.warning("hybrid state %s left behind by an interrupted switch", self.state)
            await self._make_safe()
            self._sm.transition(_S.STANDALONE_ONLY, reason="recovered interrupted switch")

    async def _timed(self, kind: Literal["hybrid_weight_sync"], work: Awaitable[None]) -> None:
        start = self._clock.now()
        await work
        self._emit_switch(kind, start, True)

    def _emit_switch(
        self,
        kind: Literal["activate", "deactivate", "rebalance", "hybrid_weight_sync"],
        start: float,
        ok: bool,
        detail: str = "",
        *,
        end: float | None = None,
    ) -> None:
        if self._events is not None:
            stop = self._clock.now() if end is None else end
            self._events.emit(SwitchEvent(kind, start, stop, ok, detail))

    def _on_membership(self, event: MembershipEvent) -> None:
        if event.kind in ("died", "removed"):
            # a fresh engine that later takes a dead member's id starts asleep: it is not
            # lent until the next activation
            gone = set(event.replica_ids)
            self._active = tuple(rid for rid in self._active if rid not in gone)
            if not self._lock.locked():
                self._drop_if_all_lost()

    def _drop_if_all_lost(self) -> None:
        """Never claim capacity that is gone: no live hybrid replica -> ``STANDALONE_ONLY``."""
        if self._sm.state is _S.HYBRID_ACTIVE and not self.active_hybrid_ids:
            reason = "every hybrid replica was lost"
            logger.warning("%s while active; back to STANDALONE_ONLY", reason)
            self._sm.transition(_S.DEACTIVATING, reason=reason)
            self._sm.transition(_S.STANDALONE_ONLY, reason=reason)

    def _on_transition(self, tr: Transition) -> None:
        if self._events is not None:
            self._events.emit(TransitionEvent(tr.time, tr.source.name, tr.target.name, tr.reason))

    def __repr__(self) -> str:
        return (
            f"DynamicResourceController(state={self.state}, hybrid={list(self.hybrid_ids)},"
            f" activations={self.activate_count}, deactivations={self.deactivate_count})"
        )
