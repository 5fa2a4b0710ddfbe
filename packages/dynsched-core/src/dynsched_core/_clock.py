"""Time source. Everything in dynsched reads time through a `Clock`.

The default clock reads the running asyncio loop's ``time()``, so a virtual-time loop
(the simulator) drives every timing in the core without changes.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "LoopClock", "ManualClock"]


@runtime_checkable
class Clock(Protocol):
    """Something that tells the current time in seconds (monotonic, arbitrary origin)."""

    def now(self) -> float:
        """Return the current time in seconds."""
        ...


class LoopClock:
    """Reads ``asyncio.get_running_loop().time()``.

    Outside a running loop it falls back to the event loop policy's current loop when
    one is set, so it can be queried from synchronous code driven by that loop.
    """

    def now(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return asyncio.get_event_loop_policy().get_event_loop().time()


class ManualClock:
    """A clock moved by hand, for synchronous tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> None:
        """Move the clock forward by ``dt`` seconds (``dt >= 0``)."""
        if dt < 0:
            raise ValueError(f"dt must be >= 0, got {dt}")
        self._t += dt
