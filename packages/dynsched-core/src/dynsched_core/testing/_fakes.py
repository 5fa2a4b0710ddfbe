"""Test fakes of the core protocols, for tests of dynsched and of host integrations.

- `CallRecorder` collects ``(time, who, method, args)`` of every call it is given, shared
  by in-memory replicas and a `RecordingRouter`, for call-order assertions.
- `RecordingRouter` wraps a `LoadBalancer` and records its calls.

The in-memory replica itself is a runtime engine (`dynsched_core.InMemoryReplica`).
No hypothesis here: these fakes are plain asyncio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from dynsched_core._clock import Clock, LoopClock
from dynsched_core._protocols import RouterListener
from dynsched_core._routing import LoadBalancer

__all__ = ["Call", "CallRecorder", "RecordingRouter"]


# ------------------------------------------------------------------------ recorder
@attrs.frozen
class Call:
    """One recorded call."""

    time: float
    who: str
    method: str
    args: tuple[Any, ...] = ()


class CallRecorder:
    """Ordered log of calls made on fakes, shared by several of them.

    Args:
        clock: Time source of the records (default: the running loop).
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else LoopClock()
        self._calls: list[Call] = []

    def record(self, who: str, method: str, *args: Any) -> Call:
        """Append a call and return it."""
        call = Call(self._clock.now(), who, method, tuple(args))
        self._calls.append(call)
        return call

    @property
    def calls(self) -> list[Call]:
        """Every recorded call, in order (a copy)."""
        return list(self._calls)

    def filter(self, who: str | None = None, method: str | None = None) -> list[Call]:
        """Recorded calls of ``who`` and/or ``method``, in order."""
        return [
            c
            for c in self._calls
            if (who is None or c.who == who) and (method is None or c.method == method)
        ]

    def methods(self, who: str | None = None) -> list[str]:
        """Method names called (on ``who`` only, when given), in order."""
        return [c.method for c in self.filter(who=who)]

    def sequence(self, *, exclude_methods: Sequence[str] = ()) -> list[tuple[str, str]]:
        """``(who, method)`` of every call, in order, without ``exclude_methods``."""
        skip = set(exclude_methods)
        return [(c.who, c.method) for c in self._calls if c.method not in skip]

    def index(self, who: str, method: str) -> int:
        """Position of the first call of ``method`` on ``who``.

        Raises:
            ValueError: no such call was recorded.
        """
        for i, c in enumerate(self._calls):
            if c.who == who and c.method == method:
                return i
        raise ValueError(f"no call of {method!r} on {who!r} was recorded")

    def clear(self) -> None:
        """Forget every recorded call."""
        self._calls.clear()

    def __len__(self) -> int:
        return len(self._calls)

    def __repr__(self) -> str:
        return f"CallRecorder({len(self._calls)} call(s))"


# -------------------------------------------------------------------------- router
class RecordingRouter:
    """A `Router` that records its calls in a `CallRecorder` and delegates to a `LoadBalancer`.

    Args:
        inner: The wrapped router (default: a new empty `LoadBalancer`).
        recorder: Where calls go (default: a new recorder, see `recorder`).
        name: The ``who`` of the records.
        record_leases: Also record ``acquire``/``release`` (noisy in long runs).

    Synchronous helpers of the wrapped `LoadBalancer` (``routable_ids``,
    ``in_flight_of``, ...) are reachable as attributes and are not recorded.
    """

    def __init__(
        self,
        inner: LoadBalancer | None = None,
        *,
        recorder: CallRecorder | None = None,
        name: str = "router",
        record_leases: bool = True,
    ) -> None:
        self.inner = inner if inner is not None else LoadBalancer()
        self.recorder = recorder if recorder is not None else CallRecorder()
        self.name = name
        self.record_leases = record_leases

    async def add_replicas(self, replica_ids: Sequence[str]) -> None:
        """Record, then delegate."""
        self.recorder.record(self.name, "add_replicas", tuple(replica_ids))
        await self.inner.add_replicas(replica_ids)

    async def remove_replicas(self, replica_ids: Sequence[str]) -> None:
        """Record, then delegate."""
        self.recorder.record(self.name, "remove_replicas", tuple(replica_ids))
        await self.inner.remove_replicas(replica_ids)

    async def acquire(self, request_id: str, exclude: Sequence[str] = ()) -> str:
        """Delegate; record ``(request_id, chosen replica)`` when leases are recorded."""
        chosen = await self.inner.acquire(request_id, exclude)
        if self.record_leases:
            self.recorder.record(self.name, "acquire", request_id, chosen)
        return chosen

    async def release(self, request_id: str, replica_id: str) -> None:
        """Record (when leases are recorded), then delegate."""
        if self.record_leases:
            self.recorder.record(self.name, "release", request_id, replica_id)
        await self.inner.release(request_id, replica_id)

    async def clear_sticky(self) -> None:
        """Record, then delegate."""
        self.recorder.record(self.name, "clear_sticky")
        await self.inner.clear_sticky()

    async def in_flight_counts(self) -> dict[str, int]:
        """Delegate (not recorded)."""
        return await self.inner.in_flight_counts()

    async def routable(self) -> list[str]:
        """Delegate (not recorded)."""
        return await self.inner.routable()

    def add_listener(self, listener: RouterListener) -> None:
        """Delegate (not recorded)."""
        self.inner.add_listener(listener)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found normally: expose the LoadBalancer helpers.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"RecordingRouter({self.inner!r}, {self.recorder!r})"
