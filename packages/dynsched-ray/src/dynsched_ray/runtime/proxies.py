"""Driver-side proxies: the core protocols (`Router`, `RolloutReplica`, `SampleQueue`)
implemented by awaiting Ray actor calls.

Every call is awaited on the running event loop (never a blocking ``ray.get``) and
bounded by a timeout. A dead actor surfaces as `ActorUnavailableError` (for a replica:
`ReplicaActorDiedError`, after which the proxy reports the death once through its
``on_death`` callback and refuses further calls).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
from dynsched_core import GenerateRequest, GenerateResult, ReplicaCapabilities, ReplicaSet
from dynsched_core._protocols import QueueStats, RouterListener
from dynsched_core._routing import RouterBook
from dynsched_core.errors import NoRoutableReplicaError
from dynsched_core.rollout import ReplicaIdentity
from ray import exceptions as rex

from dynsched_ray.runtime.errors import (
    ActorUnavailableError,
    RemoteCallTimeoutError,
    ReplicaActorDiedError,
)
from dynsched_ray.runtime.remote import await_ref

__all__ = ["DeathCallback", "RayQueue", "RayReplica", "RayRouter"]

logger = logging.getLogger(__name__)

DeathCallback = Callable[[str, BaseException], None]
"""``on_death(replica_id, exc)``: called once when a replica's actor is found dead."""


def _check_timeout(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number > 0 (seconds), got {value!r}")
    return float(value)


class _Replaceable:
    """An actor proxy that replaces its dead actor (``respawn``) and restores its state.

    The replacement of one death runs once, in its own task: it survives the
    cancellation of the call that noticed the death (e.g. a caller's own timeout), since
    cancelling it halfway would drop the fresh actor's only handle and Ray would collect
    the actor it just started. Subclasses say what to save before (`_snapshot`), what to
    call on the fresh actor (`_restore_call`) and what to record after (`_restored`).
    """

    name: str
    call_timeout_s: float

    def _init_replacement(self, handle: Any) -> None:
        self.handle = handle
        #: Starts a fresh actor when this one died (None: a death is an error).
        self.respawn: Callable[[], Awaitable[Any]] | None = None
        #: Actor replacements allowed.
        self.max_restarts = 10
        #: Actors replaced so far.
        self.restarts = 0
        #: Seconds each replacement took (death noticed -> state restored).
        self.recovery_s: list[float] = []
        self._generation = 0
        self._recover_lock = asyncio.Lock()
        self._recovery: asyncio.Future[None] | None = None

    def _can_replace(self) -> bool:
        return self.respawn is not None and self.restarts < self.max_restarts

    async def _recover(self, generation: int) -> None:
        """Run the replacement of a dead actor in its own task and wait for it."""
        task = self._recovery
        if task is None or task.done():
            if generation != self._generation:
                return
            task = self._recovery = asyncio.ensure_future(self._replace(generation))
        await asyncio.shield(task)

    async def _replace(self, generation: int) -> None:
        """Replace a dead actor (once per death) and restore its state into the fresh one."""
        async with self._recover_lock:
            if generation != self._generation:
                return  # another call already replaced it
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert self.respawn is not None
            state = self._snapshot()
            handle = await self.respawn()
            method, args = self._restore_call(state)
            answer = await await_ref(
                getattr(handle, method).remote(*args),
                timeout_s=self.call_timeout_s,
                what=f"{self.name}.{method}",
            )
            self.handle = handle
            self._generation += 1
            self.restarts += 1
            self.recovery_s.append(loop.time() - started)
            self._restored(answer, state)

    def _snapshot(self) -> Any:
        raise NotImplementedError

    def _restore_call(self, state: Any) -> tuple[str, tuple[Any, ...]]:
        raise NotImplementedError

    def _restored(self, answer: Any, state: Any) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------------------- router
class RayRouter(_Replaceable, RouterBook):
    """`Router` backed by a `RouterActor` (which wraps the core `LoadBalancer`).

    Args:
        handle: The router actor handle.
        call_timeout_s: Timeout of each actor call.
        batch: Coalesce concurrent ``acquire``/``release`` calls into one actor call
            per batch (one round trip while the previous batch is in flight collects
            the next one; no artificial delay).
        max_batch: Largest batch sent in one call.
        name: Name of the actor, for messages.

    The routable set is cached on the driver (refreshed by every add/remove and by
    `refresh`); listeners are called when it changes. ``routable_ids``/``in_flight_of``
    answer synchronously from the cache and from the leases this proxy holds. A router
    that `follow`s the run's `ReplicaSet` re-applies the set's routable members to a
    replacement actor (the cache only without one).
    """

    def __init__(
        self,
        handle: Any,
        *,
        call_timeout_s: float = 30.0,
        batch: bool = False,
        max_batch: int = 512,
        name: str = "router",
    ) -> None:
        self._init_replacement(handle)
        self.call_timeout_s = _check_timeout("call_timeout_s", call_timeout_s)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
        self.batch = bool(batch)
        self.max_batch = max_batch
        self.name = name
        self._routable: list[str] = []
        self._epoch = -1
        self._listeners: list[RouterListener] = []
        self._leases: dict[str, set[str]] = {}
        self._acq_pending: list[tuple[str, tuple[str, ...], asyncio.Future[str]]] = []
        self._rel_pending: list[tuple[str, str, asyncio.Future[None]]] = []
        self._acq_task: asyncio.Task[None] | None = None
        self._rel_task: asyncio.Task[None] | None = None
        self.calls = 0  # actor calls made (for benchmarks)
        self._members: ReplicaSet | None = None

    async def _call(self, method: str, *args: Any) -> Any:
        while True:
            self.calls += 1
            generation = self._generation
            ref = getattr(self.handle, method).remote(*args)
            try:
                return await await_ref(
                    ref, timeout_s=self.call_timeout_s, what=f"{self.name}.{method}"
                )
            except ActorUnavailableError:
                if not self._can_replace():
                    raise
                await self._recover(generation)

    def follow(self, replicas: ReplicaSet) -> None:
        """Re-apply ``replicas``' routable members to a replacement actor (the router's
        state is re-derivable: sticky sessions and the leases of running requests are not
        restored; releasing an unknown lease is a no-op)."""
        self._members = replicas

    def _snapshot(self) -> list[str]:
        logger.warning("router actor %s died; starting a fresh one", self.name)
        members = self._members
        return members.routable_ids if members is not None else list(self._routable)

    def _restore_call(self, state: list[str]) -> tuple[str, tuple[Any, ...]]:
        return "set_routable", (state,)

    def _restored(self, answer: tuple[int, list[str]], state: list[str]) -> None:
        self._update(*answer)

    def _update(self, epoch: int, ids: Sequence[str]) -> None:
        ids = sorted(ids)
        changed = ids != self._routable
        self._epoch = epoch
        self._routable = ids
        for rid in [r for r in self._leases if r not in ids]:
            del self._leases[rid]
        if changed:
            self._tell_listeners(ids)

    # ------------------------------------------------------------------ Router API
    async def add_replicas(self, replica_ids: Sequence[str]) -> None:
        """Make replicas routable (idempotent)."""
        epoch, ids = await self._call("add_replicas", list(replica_ids))
        self._update(epoch, ids)

    async def remove_replicas(self, replica_ids: Sequence[str]) -> None:
        """Stop routing to replicas (idempotent)."""
        epoch, ids = await self._call("remove_replicas", list(replica_ids))
        self._update(epoch, ids)

    async def set_routable(self, replica_ids: Sequence[str]) -> None:
        """Make exactly ``replica_ids`` routable (re-attaching to a reused router)."""
        epoch, ids = await self._call("set_routable", list(replica_ids))
        self._update(epoch, ids)

    async def refresh(self) -> list[str]:
        """Re-read the routable set from the actor (listeners hear of a change)."""
        epoch, ids = await self._call("routable")
        self._update(epoch, ids)
        return list(self._routable)

    async def acquire(self, request_id: str, exclude: Sequence[str] = ()) -> str:
        """Pick a routable replica for ``request_id`` (see `LoadBalancer.acquire`)."""
        if self.batch:
            fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._acq_pending.append((request_id, tuple(exclude), fut))
            if self._acq_task is None or self._acq_task.done():
                self._acq_task = asyncio.ensure_future(self._flush_acquires())
            chosen = await fut
        else:
            chosen = await self._call("acquire", request_id, tuple(exclude))
        self._leases.setdefault(chosen, set()).add(request_id)
        return chosen

    async def acquire_many(
        self, request_ids: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[str | None]:
        """Route many requests in one actor call; ``None`` where nothing was routable."""
        out: list[str | None] = await self._call(
            "acquire_batch", [(r, tuple(exclude)) for r in request_ids]
        )
        for req, chosen in zip(request_ids, out, strict=True):
            if chosen is not None:
                self._leases.setdefault(chosen, set()).add(req)
        return out

    async def release(self, request_id: str, replica_id: str) -> None:
        """Un-count an in-flight request (no-op when absent)."""
        leases = self._leases.get(replica_id)
        if leases is not None:
            leases.discard(request_id)
        if self.batch:
            await self._enqueue_release(request_id, replica_id)
        else:
            await self._call("release", request_id, replica_id)

    async def release_many(self, items: Sequence[tuple[str, str]]) -> None:
        """Release many ``(request_id, replica_id)`` leases in one actor call."""
        for req, rid in items:
            leases = self._leases.get(rid)
            if leases is not None:
                leases.discard(req)
        await self._call("release_batch", list(items))

    async def clear_sticky(self) -> None:
        """Forget every sticky session."""
        await self._call("clear_sticky")

    async def in_flight_counts(self) -> dict[str, int]:
        """In-flight requests per routable replica (asked from the actor)."""
        out: dict[str, int] = await self._call("in_flight_counts")
        return out

    async def routable(self) -> list[str]:
        """Ids of the routable replicas, sorted (asked from the actor)."""
        return await self.refresh()

    # add_listener, remove_listener: from `RouterBook` (called when the set seen here changes)

    # --------------------------------------------------------- synchronous answers
    def routable_ids(self) -> list[str]:
        """Routable replica ids as last seen by this proxy."""
        return list(self._routable)

    def is_routable(self, replica_id: str) -> bool:
        """Whether ``replica_id`` was routable when last seen."""
        return replica_id in self._routable

    # in_flight_of, total_in_flight, requests_on: from `RouterBook` (this proxy's leases)

    # ------------------------------------------------------------------ batching
    async def _flush_acquires(self) -> None:
        while self._acq_pending:
            batch = self._acq_pending[: self.max_batch]
            del self._acq_pending[: self.max_batch]
            try:
                out = await self._call("acquire_batch", [(r, ex) for r, ex, _ in batch])
            except BaseException as exc:
                _fail_all([f for _, _, f in batch], exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (req, ex, fut), chosen in zip(batch, out, strict=True):
                if fut.done():
                    if chosen is not None:  # the caller went away: give the lease back
                        self._enqueue_release(req, chosen)
                    continue
                if chosen is None:
                    fut.set_exception(
                        NoRoutableReplicaError(
                            f"no routable replica for request {req!r}"
                            f" (routable: {self._routable}, excluded: {sorted(ex)})"
                        )
                    )
                else:
                    fut.set_result(chosen)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) until the batched calls already queued were sent."""
        tasks = [t for t in (self._acq_task, self._rel_task) if t is not None and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s or self.call_timeout_s)

    def _enqueue_release(self, request_id: str, replica_id: str) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rel_pending.append((request_id, replica_id, fut))
        if self._rel_task is None or self._rel_task.done():
            self._rel_task = asyncio.ensure_future(self._flush_releases())
        return fut

    async def _flush_releases(self) -> None:
        while self._rel_pending:
            batch = self._rel_pending[: self.max_batch]
            del self._rel_pending[: self.max_batch]
            try:
                await self._call("release_batch", [(r, rid) for r, rid, _ in batch])
            except BaseException as exc:
                _fail_all([f for _, _, f in batch], exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_result(None)

    def __repr__(self) -> str:
        return f"RayRouter({self.name!r}, routable={self._routable}, batch={self.batch})"


def _cancel(ref: Any) -> None:
    try:
        import ray

        ray.cancel(ref)
    except Exception:
        logger.debug("could not cancel %r", ref, exc_info=True)


def _fail_all(futures: Sequence[asyncio.Future[Any]], exc: BaseException) -> None:
    """Propagate a batch call's failure to its waiters (cancellation as cancellation)."""
    for fut in futures:
        if fut.done():
            continue
        if isinstance(exc, Exception):
            fut.set_exception(exc)
            # an orphan lease release has no waiter: do not warn about it later
            fut.add_done_callback(lambda f: f.exception())
        else:
            fut.cancel()


# --------------------------------------------------------------------------- replica
class RayReplica(ReplicaIdentity):
    """`RolloutReplica` backed by a `ReplicaActor`.

    Args:
        handle: The replica actor handle.
        replica_id: Id of the hosted replica.
        capabilities: Its capabilities (read once from the actor by `connect`); an empty
            ``node`` is filled with the Ray node id of ``placement``.
        placement: Where the actor runs (see `placement_info`).
        call_timeout_s: Timeout of control calls (abort, sleep, wake_up, ...).
        generate_timeout_s: Timeout of one generation attempt; when streaming, the
            longest wait for the next segment (a stalled actor counts as failed).
        on_death: Called once with ``(replica_id, exc)`` when the actor is found dead.
        stream: Generate through the actor's ``generate_stream``: the tokens of finished
            segments reach the driver as they come, so when the actor dies mid-generation
            the attempt returns as aborted *with those tokens* (the retrying client
            resumes it elsewhere after them) instead of failing empty-handed.

    `is_dead` is this *actor's* transport state (its calls are refused from then on, with
    the death's cause); the run's liveness of record is the replica's `ReplicaSet` member,
    which ``on_death`` tells and which outlives the actor (a respawn re-uses the id).
    """

    def __init__(
        self,
        handle: Any,
        replica_id: str,
        capabilities: ReplicaCapabilities,
        *,
        placement: dict[str, Any] | None = None,
        call_timeout_s: float = 60.0,
        generate_timeout_s: float = 600.0,
        on_death: DeathCallback | None = None,
        stream: bool = False,
    ) -> None:
        self.handle = handle
        self.stream = bool(stream)
        self._id = replica_id
        self.placement: dict[str, Any] = dict(placement or {})
        node = self.placement.get("node_id")
        if not capabilities.node and isinstance(node, str) and node:
            capabilities = attrs.evolve(capabilities, node=node)  # the Ray node it runs on
        self._caps = capabilities
        self.call_timeout_s = _check_timeout("call_timeout_s", call_timeout_s)
        self.generate_timeout_s = _check_timeout("generate_timeout_s", generate_timeout_s)
        self._on_death: list[DeathCallback] = [on_death] if on_death is not None else []
        self._dead: BaseException | None = None
        #: ``(request_id, tokens kept)`` of each attempt cut short by the actor's death.
        self.interrupted: list[tuple[str, int]] = []

    @classmethod
    async def connect(cls, handle: Any, *, timeout_s: float = 120.0, **kwargs: Any) -> RayReplica:
        """Wait for the actor to be up and build its proxy (reads id, capabilities, placement).

        Raises:
            RemoteCallTimeoutError: the actor did not start within ``timeout_s``.
            ActorUnavailableError: the actor died while starting.
        """
        desc = await await_ref(
            handle.describe.remote(), timeout_s=timeout_s, what="replica.describe"
        )
        return cls(
            handle, desc["replica_id"], desc["capabilities"], placement=desc["placement"], **kwargs
        )

    # ----------------------------------------------------------------- properties
    # replica_id, capabilities, role: from `ReplicaIdentity`
    @property
    def is_dead(self) -> bool:
        """True once the actor was found dead (or `mark_dead` was called)."""
        return self._dead is not None

    def add_death_callback(self, callback: DeathCallback) -> None:
        """Also call ``callback(replica_id, exc)`` when the actor is found dead."""
        self._on_death.append(callback)

    def mark_dead(self, exc: BaseException) -> None:
        """Record the death (once) and tell the callbacks."""
        if self._dead is not None:
            return
        self._dead = exc
        logger.warning("replica %s is dead: %r", self._id, exc)
        for cb in list(self._on_death):
            try:
                cb(self._id, exc)
            except Exception:
                logger.exception("death callback %r failed for replica %s", cb, self._id)

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        what = f"replica[{self._id}].{method}"
        if self._dead is not None:
            raise ReplicaActorDiedError(self._id, what, self._dead)
        ref = getattr(self.handle, method).remote(*args)
        try:
            return await await_ref(ref, timeout_s=timeout_s or self.call_timeout_s, what=what)
        except ActorUnavailableError as exc:
            self.mark_dead(exc)
            raise ReplicaActorDiedError(self._id, what, exc) from exc

    async def ping(self, timeout_s: float | None = None) -> bool:
        """True when the actor answers; False (and marked dead) when it is gone."""
        try:
            return bool(await self._call("ping", timeout_s=timeout_s))
        except ReplicaActorDiedError:
            return False

    # --------------------------------------------------------- RolloutReplica API
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one generation attempt on the actor.

        When streaming and the actor dies after some segments, returns an aborted result
        holding the tokens received so far (and reports the death).
        """
        if not self.stream:
            try:
                result: GenerateResult = await self._call(
                    "generate", request, timeout_s=self.generate_timeout_s
                )
            except ReplicaActorDiedError:
                self.interrupted.append((request.request_id, 0))
                raise
            return result
        return await self._generate_streamed(request)

    async def _generate_streamed(self, request: GenerateRequest) -> GenerateResult:
        what = f"replica[{self._id}].generate_stream"
        if self._dead is not None:
            raise ReplicaActorDiedError(self._id, what, self._dead)
        stream = self.handle.generate_stream.remote(request)
        last: GenerateResult | None = None
        try:
            while True:
                try:
                    ref = await asyncio.wait_for(stream.__anext__(), self.generate_timeout_s)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    _cancel(stream)
                    raise RemoteCallTimeoutError(what, self.generate_timeout_s) from None
                result: GenerateResult
                kind, result = await await_ref(ref, timeout_s=self.generate_timeout_s, what=what)
                last = result
                if kind == "final":
                    return result
        except (ActorUnavailableError, rex.RayActorError) as exc:
            self.mark_dead(exc)
            self.interrupted.append((request.request_id, last.num_tokens if last else 0))
            if last is not None and last.num_tokens > 0:
                logger.info(
                    "replica %s died while generating %s; keeping %d token(s)",
                    self._id,
                    request.request_id,
                    last.num_tokens,
                )
                return attrs.evolve(last, finish_reason="abort")
            raise ReplicaActorDiedError(self._id, what, exc) from exc
        except asyncio.CancelledError:
            _cancel(stream)
            raise
        if last is None:
            raise RuntimeError(f"{what} ended without a result")
        return last

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """Abort in-flight requests (all when ``None``)."""
        ids = None if request_ids is None else list(request_ids)
        return int(await self._call("abort", ids))

    async def sleep(self) -> None:
        """Release memory on the actor."""
        await self._call("sleep")

    async def wake_up(self) -> None:
        """Reload after `sleep`."""
        await self._call("wake_up")

    async def resume(self) -> None:
        """Accept generation requests again."""
        await self._call("resume")

    async def update_weights(self, version: int, weights: Any = None) -> None:
        """Load weights of ``version`` (``weights`` travels through Ray's object store)."""
        await self._call("update_weights", version, weights)

    async def in_flight(self) -> int:
        """Requests running on the actor."""
        return int(await self._call("in_flight"))

    async def call(self, method: str, *args: Any) -> Any:
        """Call any other method of the hosted replica."""
        return await self._call("call", method, *args)

    def __repr__(self) -> str:
        state = "dead" if self._dead is not None else "alive"
        return f"RayReplica({self._id!r}, role={self._caps.role!r}, {state})"


# ----------------------------------------------------------------------------- queue
_MISSING = object()


def _sample_key(sample: Any) -> str:
    """The journal key of a sample: its ``sample_id`` (unique per run)."""
    sid = getattr(sample, "sample_id", None)
    return repr(sample) if sid is None else str(sid)


class RayQueue(_Replaceable):
    """`SampleQueue` backed by a `QueueActor` (which wraps the core `AsyncSampleQueue`).

    Args:
        handle: The queue actor handle.
        call_timeout_s: Timeout of non-waiting calls.
        max_wait_s: Bound used for waits given ``timeout=None`` (every wait is bounded).
        grace_s: Added to a wait's own timeout to bound the actor call itself.
        capacity: The actor queue's capacity (reported by `capacity`).
    """

    def __init__(
        self,
        handle: Any,
        *,
        call_timeout_s: float = 30.0,
        max_wait_s: float = 3600.0,
        grace_s: float = 30.0,
        capacity: int | None = None,
        name: str = "queue",
    ) -> None:
        self._init_replacement(handle)
        self.capacity = capacity
        self.call_timeout_s = _check_timeout("call_timeout_s", call_timeout_s)
        self.max_wait_s = _check_timeout("max_wait_s", max_wait_s)
        self.grace_s = _check_timeout("grace_s", grace_s)
        self.name = name
        self._size = 0
        self._closed = False
        #: Called with each sample after its ``put`` was acknowledged (for checks).
        self.on_put: Callable[[Any], None] | None = None
        #: Samples restored into replacement actors (summed over restarts).
        self.restored_samples = 0
        # Journal of acknowledged operations: what the actor holds, in order.
        self._journal: dict[str, Any] = {}
        self._taken_early: set[str] = set()
        self._produced = 0
        self._consumed = 0
        self._dropped = 0

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s or self.call_timeout_s)
        while True:
            generation = self._generation
            ref = getattr(self.handle, method).remote(*args)
            try:
                return await await_ref(
                    ref,
                    timeout_s=max(deadline - loop.time(), 0.001),
                    what=f"{self.name}.{method}",
                )
            except ActorUnavailableError:
                if not self._can_replace():
                    raise
                await self._recover(generation)

    def state_dict(self) -> dict[str, Any]:
        """The journal as an `AsyncSampleQueue` state: acknowledged contents and counters.

        Every ``put`` the actor acknowledged and no ``get`` returned is in it, in order;
        this is what a replacement actor is loaded with after the queue actor died.
        """
        return {
            "format": 1,
            "items": list(self._journal.values()),
            "produced": self._produced,
            "consumed": self._consumed,
            "dropped": self._dropped,
            "closed": self._closed,
        }

    def _snapshot(self) -> dict[str, Any]:
        """What a replacement queue actor is loaded with: the journal (`state_dict`).

        The queue's contents are *checkpointed*, write-through: the rollouter and the
        trainer both reach the actor through this proxy, which records each acknowledged
        ``put`` (by sample id) and each acknowledged ``get``. A call cut short by the
        death was not acknowledged: a ``put`` is retried on the replacement (it was not
        recorded, so it lands once), a ``get`` is retried too (its samples are still in
        the journal, so none is lost).
        """
        state = self.state_dict()
        logger.warning(
            "queue actor %s died; restoring %d sample(s) into a fresh one",
            self.name,
            len(state["items"]),
        )
        return state

    def _restore_call(self, state: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        return "load_state_dict", (state,)

    def _restored(self, answer: Any, state: dict[str, Any]) -> None:
        self.restored_samples += len(state["items"])

    def _journal_put(self, sample: Any) -> None:
        self._produced += 1
        if self.on_put is not None:
            self.on_put(sample)
        sid = _sample_key(sample)
        if sid in self._taken_early:  # its get was acknowledged first
            self._taken_early.discard(sid)
            return
        self._journal[sid] = sample

    def _journal_get(self, samples: Sequence[Any]) -> None:
        self._consumed += len(samples)
        for sample in samples:
            sid = _sample_key(sample)
            if self._journal.pop(sid, _MISSING) is _MISSING:
                self._taken_early.add(sid)

    def _wait(self, timeout: float | None) -> tuple[float, float]:
        inner = self.max_wait_s if timeout is None else float(timeout)
        return inner, inner + self.grace_s

    async def put(self, sample: Any, timeout: float | None = None) -> None:
        """Append a sample, waiting (bounded) for room."""
        inner, outer = self._wait(timeout)
        self._size = int(await self._call("put", sample, inner, timeout_s=outer))
        self._journal_put(sample)

    async def offer(self, sample: Any) -> bool:
        """Append without waiting; False when full."""
        accepted = bool(await self._call("offer", sample))
        if accepted:
            self._journal_put(sample)
        else:
            self._dropped += 1
        return accepted

    async def get(self, n: int, timeout: float | None = None) -> list[Any]:
        """Remove and return ``n`` samples (fewer only after end-of-stream)."""
        inner, outer = self._wait(timeout)
        out: list[Any] = await self._call("get", n, inner, timeout_s=outer)
        self._journal_get(out)
        self._size = max(self._size - len(out), 0)
        return out

    async def get_nowait(self, n: int | None = None) -> list[Any]:
        """Remove and return up to ``n`` buffered samples without waiting."""
        out: list[Any] = await self._call("get_nowait", n)
        self._journal_get(out)
        self._size = max(self._size - len(out), 0)
        return out

    async def wait_for(self, n: int, timeout: float | None = None) -> int:
        """Wait until ``n`` samples are buffered or end-of-stream."""
        inner, outer = self._wait(timeout)
        self._size = int(await self._call("wait_for", n, inner, timeout_s=outer))
        return self._size

    async def size(self) -> int:
        """Samples buffered."""
        self._size = int(await self._call("size"))
        return self._size

    def qsize(self) -> int:
        """Samples buffered as last seen by this proxy (synchronous, may lag)."""
        return self._size

    async def held_sample_ids(self) -> list[str]:
        """Ids of the samples the queue *actor* holds now, in order (nothing is taken).

        Asked of the actor, not read from this proxy's journal: a sample the actor lost
        (e.g. in a replacement) is not listed, so a per-id check can see the loss.
        """
        return list(await self._call("held_sample_ids"))

    async def close(self) -> None:
        """Mark end-of-stream."""
        await self._call("close")
        self._closed = True

    @property
    def closed(self) -> bool:
        """True after `close` was called through this proxy."""
        return self._closed

    async def stats(self) -> QueueStats:
        """Counters."""
        st: QueueStats = await self._call("stats")
        self._size = st.size
        self._closed = st.closed
        return st

    def __repr__(self) -> str:
        return f"RayQueue({self.name!r}, size~{self._size})"
