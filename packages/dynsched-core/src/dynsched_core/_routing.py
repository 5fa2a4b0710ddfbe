"""`LoadBalancer`: least-in-flight routing with sticky sessions (implements `Router`).

Routing rules, in order:

1. A request id with a sticky entry goes back to its sticky replica when that replica is
   still routable and not excluded (a retry after an abort lands where it ran before,
   unless that replica left routing).
2. Otherwise the routable, non-excluded replica with the fewest in-flight requests wins;
   ties are broken by replica id (lexicographic), so routing is deterministic.

In-flight counts are *leases*: one per ``(request_id, replica_id)``. ``acquire`` creates
the lease, ``release`` removes it; releasing twice (or releasing a lease that never
existed) is a no-op, so counts are released exactly once. Removing a replica drops its
leases (they stop counting) and its sticky entries.

Everything runs on one event loop; the methods never suspend, so no lock is needed and a
decision is never interleaved with another coroutine.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from dynsched_core._errors import NoRoutableReplicaError
from dynsched_core._protocols import RouterListener

__all__ = ["LoadBalancer", "RouterBook"]

logger = logging.getLogger(__name__)

DEFAULT_STICKY_CAPACITY = 100_000


def _check_ids(replica_ids: Iterable[str], what: str) -> list[str]:
    if isinstance(replica_ids, str):
        raise TypeError(f"{what} expects a sequence of replica ids, got the string {replica_ids!r}")
    ids = list(replica_ids)
    for rid in ids:
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"{what}: replica ids must be non-empty strings, got {rid!r}")
    return ids


class RouterBook:
    """What every router keeps besides its routing rule, shared by `LoadBalancer` and the
    Ray router's proxy: the listeners of its routable set and its in-flight leases
    (``replica id -> request ids``), with their synchronous answers."""

    _leases: dict[str, set[str]]
    _listeners: list[RouterListener]

    def add_listener(self, listener: RouterListener) -> None:
        """Call ``listener(routable_ids)`` right after each change of the routable set.

        A listener that raises is logged; the other listeners still run.
        """
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {listener!r}")
        self._listeners.append(listener)

    def remove_listener(self, listener: RouterListener) -> None:
        """Unregister a listener added with `add_listener` (no-op when unknown)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _tell_listeners(self, ids: Sequence[str]) -> None:
        for listener in list(self._listeners):
            try:
                listener(list(ids))
            except Exception:
                logger.exception("router listener %r failed", listener)

    def in_flight_of(self, replica_id: str) -> int:
        """Live leases on ``replica_id`` (0 when it holds none or is not routable)."""
        return len(self._leases.get(replica_id, ()))

    def total_in_flight(self) -> int:
        """Live leases over every replica."""
        return sum(len(v) for v in self._leases.values())

    def requests_on(self, replica_id: str) -> list[str]:
        """Request ids holding a lease on ``replica_id``, sorted."""
        return sorted(self._leases.get(replica_id, ()))


class LoadBalancer(RouterBook):
    """Least-in-flight router with bounded sticky sessions.

    Implements the `dynsched_core.Router` protocol. The async methods do not suspend;
    synchronous twins (`routable_ids`, `in_flight_of`, ...) serve code that cannot await
    (router listeners, properties, metrics).

    Args:
        replica_ids: Replicas routable from the start.
        sticky_capacity: Maximum number of sticky entries kept (least recently used ones
            are evicted first); ``0`` disables sticky sessions.

    Example:
        >>> import asyncio
        >>> lb = LoadBalancer(["r0", "r1"])
        >>> asyncio.run(lb.acquire("req-1"))
        'r0'
    """

    def __init__(
        self,
        replica_ids: Sequence[str] = (),
        *,
        sticky_capacity: int = DEFAULT_STICKY_CAPACITY,
    ) -> None:
        if isinstance(sticky_capacity, bool) or not isinstance(sticky_capacity, int):
            raise TypeError(f"sticky_capacity must be an int >= 0, got {sticky_capacity!r}")
        if sticky_capacity < 0:
            raise ValueError(f"sticky_capacity must be >= 0, got {sticky_capacity}")
        self._sticky_capacity = sticky_capacity
        # replica id -> request ids holding a lease on it (only routable replicas).
        self._leases: dict[str, set[str]] = {}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._listeners: list[RouterListener] = []
        for rid in _check_ids(replica_ids, "LoadBalancer"):
            self._leases.setdefault(rid, set())

    # ------------------------------------------------------------------ Router API
    async def add_replicas(self, replica_ids: Sequence[str]) -> None:
        """Make replicas routable (idempotent); listeners hear of a change."""
        self.add_replicas_nowait(replica_ids)

    async def remove_replicas(self, replica_ids: Sequence[str]) -> None:
        """Stop routing to replicas, drop their leases and sticky entries (idempotent)."""
        self.remove_replicas_nowait(replica_ids)

    async def acquire(self, request_id: str, exclude: Sequence[str] = ()) -> str:
        """Pick a replica for ``request_id`` and lease it there.

        Args:
            request_id: Id of the (logical) request; a retry reuses it.
            exclude: Replicas not to use (e.g. ones that just failed this request).

        Returns:
            The chosen replica id.

        Raises:
            NoRoutableReplicaError: no routable replica outside ``exclude``.
        """
        return self.acquire_nowait(request_id, exclude)

    async def release(self, request_id: str, replica_id: str) -> None:
        """Drop the lease of ``request_id`` on ``replica_id`` (no-op when absent)."""
        self.release_nowait(request_id, replica_id)

    async def clear_sticky(self) -> None:
        """Forget every sticky session."""
        self.clear_sticky_nowait()

    async def in_flight_counts(self) -> dict[str, int]:
        """In-flight requests (live leases) per routable replica."""
        return self.in_flight_counts_nowait()

    async def routable(self) -> list[str]:
        """Ids of the routable replicas, sorted."""
        return self.routable_ids()

    # add_listener, remove_listener: from `RouterBook`

    # ------------------------------------------------------------ synchronous twins
    def add_replicas_nowait(self, replica_ids: Sequence[str]) -> None:
        """Synchronous `add_replicas`."""
        added = [rid for rid in _check_ids(replica_ids, "add_replicas") if rid not in self._leases]
        for rid in added:
            self._leases[rid] = set()
        if added:
            logger.debug("replicas added to routing: %s", added)
            self._notify()

    def remove_replicas_nowait(self, replica_ids: Sequence[str]) -> None:
        """Synchronous `remove_replicas`."""
        removed = {rid for rid in _check_ids(replica_ids, "remove_replicas") if rid in self._leases}
        if not removed:
            return
        dropped_leases = 0
        for rid in removed:
            dropped_leases += len(self._leases.pop(rid))
        stale = [req for req, rid in self._sticky.items() if rid in removed]
        for req in stale:
            del self._sticky[req]
        logger.debug(
            "replicas removed from routing: %s (%d lease(s), %d sticky entries dropped)",
            sorted(removed),
            dropped_leases,
            len(stale),
        )
        self._notify()

    def acquire_nowait(self, request_id: str, exclude: Sequence[str] = ()) -> str:
        """Synchronous `acquire`."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {request_id!r}")
        excluded = set(exclude)
        chosen = self._sticky.get(request_id)
        if chosen is not None and (chosen not in self._leases or chosen in excluded):
            chosen = None
        if chosen is None:
            candidates = (
                [rid for rid in self._leases if rid not in excluded] if excluded else self._leases
            )
            if not candidates:
                raise NoRoutableReplicaError(
                    f"no routable replica for request {request_id!r}"
                    f" (routable: {self.routable_ids()}, excluded: {sorted(excluded)})"
                )
            leases = self._leases
            chosen = min(candidates, key=lambda rid: (len(leases[rid]), rid))
        self._leases[chosen].add(request_id)
        self._remember(request_id, chosen)
        return chosen

    def release_nowait(self, request_id: str, replica_id: str) -> None:
        """Synchronous `release`."""
        leases = self._leases.get(replica_id)
        if leases is not None:
            leases.discard(request_id)

    def clear_sticky_nowait(self) -> None:
        """Synchronous `clear_sticky`."""
        self._sticky.clear()

    def in_flight_counts_nowait(self) -> dict[str, int]:
        """Synchronous `in_flight_counts` (sorted by replica id)."""
        return {rid: len(self._leases[rid]) for rid in sorted(self._leases)}

    def routable_ids(self) -> list[str]:
        """Ids of the routable replicas, sorted."""
        return sorted(self._leases)

    def is_routable(self, replica_id: str) -> bool:
        """Whether ``replica_id`` is currently routable."""
        return replica_id in self._leases

    def sticky_replica(self, request_id: str) -> str | None:
        """The sticky replica of ``request_id``, if one is remembered (no LRU touch)."""
        return self._sticky.get(request_id)

    def forget(self, request_id: str) -> None:
        """Drop the sticky entry of ``request_id`` (e.g. when it finished for good)."""
        self._sticky.pop(request_id, None)

    @property
    def sticky_size(self) -> int:
        """Number of sticky entries held."""
        return len(self._sticky)

    @property
    def sticky_capacity(self) -> int:
        """Maximum number of sticky entries."""
        return self._sticky_capacity

    # ------------------------------------------------------------------- internals
    def _remember(self, request_id: str, replica_id: str) -> None:
        if self._sticky_capacity == 0:
            return
        self._sticky[request_id] = replica_id
        self._sticky.move_to_end(request_id)
        while len(self._sticky) > self._sticky_capacity:
            self._sticky.popitem(last=False)

    def _notify(self) -> None:
        self._tell_listeners(self.routable_ids())

    def __repr__(self) -> str:
        return (
            f"LoadBalancer(in_flight={self.in_flight_counts_nowait()}, sticky={self.sticky_size})"
        )
