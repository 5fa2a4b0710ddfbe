"""`AsyncSampleQueue`: the bounded, end-of-stream-aware queue between rollouter and trainer.

Every wait is bounded: by its ``timeout`` (measured on the running loop, so a virtual-time
loop drives it) and by end-of-stream (`close`). ``wait_for``/``get`` return early once
the producer has finished instead of hanging at the end of training.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from dynsched_core._errors import SampleWaitTimeoutError
from dynsched_core._events import sample_key
from dynsched_core._protocols import QueueStats

__all__ = ["AsyncSampleQueue"]

logger = logging.getLogger(__name__)

_STATE_FORMAT = 1


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise ValueError(f"timeout must be None or a number >= 0, got {timeout!r}")


class AsyncSampleQueue:
    """Bounded FIFO queue of finished samples (implements `dynsched_core.SampleQueue`).

    Counters: ``produced`` (samples accepted by `put`/`offer`), ``consumed`` (removed by
    `get`/`get_nowait`), ``dropped`` (refused by `offer` because the queue was full).

    Args:
        capacity: Maximum number of buffered samples; ``None`` for unbounded.

    Example:
        >>> import asyncio
        >>> async def demo() -> list[int]:
        ...     q = AsyncSampleQueue(capacity=4)
        ...     await q.put(1)
        ...     await q.close()
        ...     return await q.get(3, timeout=1.0)  # end-of-stream: returns what is there
        >>> asyncio.run(demo())
        [1]
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
        ):
            raise ValueError(f"capacity must be None (unbounded) or an int >= 1, got {capacity!r}")
        self._capacity = capacity
        self._items: deque[Any] = deque()
        self._closed = False
        self._produced = 0
        self._consumed = 0
        self._dropped = 0
        # insertion-ordered (a dict, not a set): waiters wake in arrival order, so runs
        # on a virtual-time loop are reproducible bit for bit
        self._waiters: dict[asyncio.Future[None], None] = {}

    # ------------------------------------------------------------------ producer side
    async def put(self, sample: Any, timeout: float | None = None) -> None:
        """Append ``sample``, waiting for room when full.

        Raises:
            SampleWaitTimeoutError: still full after ``timeout`` seconds.
            RuntimeError: the queue is closed (also when it closes during the wait).
        """
        _check_timeout(timeout)
        self._check_open()
        if self._has_room():
            self._append(sample)
            return
        await self._wait_until(
            lambda: self._closed or self._has_room(),
            timeout,
            lambda: SampleWaitTimeoutError(1, 0, _t(timeout)),  # 1 free slot wanted, 0 free
        )
        self._check_open()
        self._append(sample)

    def offer(self, sample: Any) -> bool:
        """Append ``sample`` without waiting.

        Returns:
            True when accepted, False when the queue was full (counted in ``dropped``).

        Raises:
            RuntimeError: the queue is closed.
        """
        self._check_open()
        if not self._has_room():
            self._dropped += 1
            return False
        self._append(sample)
        return True

    async def close(self) -> None:
        """Mark end-of-stream; waiting consumers return what is buffered."""
        self.close_nowait()

    def close_nowait(self) -> None:
        """Synchronous `close` (idempotent)."""
        if not self._closed:
            self._closed = True
            logger.debug("sample queue closed with %d sample(s) buffered", len(self._items))
            self._wake()

    # ------------------------------------------------------------------ consumer side
    async def wait_for(self, n: int, timeout: float | None = None) -> int:
        """Wait until ``n`` samples are buffered or end-of-stream.

        Returns:
            Samples buffered when the wait ended (``< n`` only after end-of-stream).

        Raises:
            SampleWaitTimeoutError: neither happened within ``timeout`` seconds.
            ValueError: ``n`` is negative or larger than the capacity (never satisfiable).
        """
        self._check_n(n)
        _check_timeout(timeout)
        await self._wait_until(
            lambda: self._closed or len(self._items) >= n,
            timeout,
            lambda: SampleWaitTimeoutError(n, len(self._items), _t(timeout)),
        )
        return len(self._items)

    async def get(self, n: int, timeout: float | None = None) -> list[Any]:
        """Remove and return ``n`` samples (oldest first), waiting for them.

        Returns fewer than ``n`` only after end-of-stream. Nothing is removed on timeout.

        Raises:
            SampleWaitTimeoutError: fewer than ``n`` buffered after ``timeout`` seconds.
            ValueError: ``n`` is negative or larger than the capacity.
        """
        await self.wait_for(n, timeout)
        return self.get_nowait(n)

    def get_nowait(self, n: int | None = None) -> list[Any]:
        """Remove and return up to ``n`` samples (all when ``None``) without waiting."""
        if n is None:
            n = len(self._items)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        out = [self._items.popleft() for _ in range(min(n, len(self._items)))]
        if out:
            self._consumed += len(out)
            self._wake()
        return out

    async def size(self) -> int:
        """Samples currently buffered."""
        return len(self._items)

    def qsize(self) -> int:
        """Samples currently buffered (synchronous)."""
        return len(self._items)

    async def stats(self) -> QueueStats:
        """Current counters."""
        return self.stats_nowait()

    def stats_nowait(self) -> QueueStats:
        """Current counters (synchronous)."""
        return QueueStats(
            size=len(self._items),
            produced=self._produced,
            consumed=self._consumed,
            dropped=self._dropped,
            closed=self._closed,
            capacity=self._capacity,
        )

    # -------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The buffered samples (in order), the counters and the end-of-stream flag.

        The samples are kept as they are (no copy, no serialisation): the caller decides
        how to store them. With `load_state_dict` a new queue continues where this one
        was, so a queue host that dies can be rebuilt without losing or repeating a
        sample (see dynsched-ray's ``RayQueue``).
        """
        return {
            "format": _STATE_FORMAT,
            "items": list(self._items),
            "produced": self._produced,
            "consumed": self._consumed,
            "dropped": self._dropped,
            "closed": self._closed,
        }

    async def held_sample_ids(self) -> list[str]:
        """Ids of the buffered samples, in order (``str(sample_id)``, else ``repr``).

        Read-only: nothing is taken. `FullyAsyncLoop` reports them as a ``left``
        `SampleEvent` when it ends.
        """
        return [sample_key(s) for s in self._items]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the contents and counters with what `state_dict` returned.

        Waiting consumers are woken (the restored samples may satisfy them).

        Raises:
            ValueError: unknown format, missing keys, or more samples than the capacity.
        """
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"unsupported AsyncSampleQueue state format {state.get('format')!r}")
        missing = {"items", "produced", "consumed", "dropped", "closed"} - set(state)
        if missing:
            raise ValueError(f"AsyncSampleQueue state lacks keys {sorted(missing)}")
        items = list(state["items"])
        if self._capacity is not None and len(items) > self._capacity:
            raise ValueError(
                f"state holds {len(items)} samples, more than the capacity {self._capacity}"
            )
        self._items = deque(items)
        self._produced = int(state["produced"])
        self._consumed = int(state["consumed"])
        self._dropped = int(state["dropped"])
        self._closed = bool(state["closed"])
        self._wake()

    # -------------------------------------------------------------------- properties
    @property
    def capacity(self) -> int | None:
        """Maximum number of buffered samples (``None``: unbounded)."""
        return self._capacity

    @property
    def closed(self) -> bool:
        """True after `close` (end-of-stream)."""
        return self._closed

    @property
    def produced(self) -> int:
        """Samples accepted so far."""
        return self._produced

    @property
    def consumed(self) -> int:
        """Samples removed so far."""
        return self._consumed

    @property
    def dropped(self) -> int:
        """Samples refused by `offer` because the queue was full."""
        return self._dropped

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        s = self.stats_nowait()
        return (
            f"AsyncSampleQueue(size={s.size}, capacity={s.capacity}, produced={s.produced},"
            f" consumed={s.consumed}, dropped={s.dropped}, closed={s.closed})"
        )

    # --------------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("sample queue is closed (end-of-stream); no more samples accepted")

    def _check_n(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        if self._capacity is not None and n > self._capacity:
            raise ValueError(
                f"cannot wait for {n} samples in a queue of capacity {self._capacity}"
                " (the producer would block before reaching it)"
            )

    def _has_room(self) -> bool:
        return self._capacity is None or len(self._items) < self._capacity

    def _append(self, sample: Any) -> None:
        self._items.append(sample)
        self._produced += 1
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _wait_until(
        self,
        ready: Callable[[], bool],
        limit_s: float | None,
        on_timeout: Callable[[], BaseException],
    ) -> None:
        if ready():
            return
        loop = asyncio.get_running_loop()
        deadline = None if limit_s is None else loop.time() + limit_s
        while not ready():
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise on_timeout()
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters[fut] = None
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                if not ready():
                    raise on_timeout() from None
            finally:
                self._waiters.pop(fut, None)


def _t(timeout: float | None) -> float:
    return float("inf") if timeout is None else float(timeout)
