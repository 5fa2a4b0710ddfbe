"""The virtual-time loop: time jumps, asyncio primitives work, no wall-clock dependence."""

from __future__ import annotations

import asyncio
import time

import pytest
from dynsched_sim import SimulationDeadlockError, VirtualTimeEventLoop, run_virtual


def test_sleep_jumps_virtual_time_without_waiting() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()

        async def w(d: float) -> float:
            await asyncio.sleep(d)
            return loop.time()

        return await asyncio.gather(w(3600.0), w(5.0), w(86400.0 * 30))

    t0 = time.perf_counter()
    assert run_virtual(main()) == [3600.0, 5.0, 86400.0 * 30]
    assert time.perf_counter() - t0 < 5.0  # a month of simulated time, not a month of waiting


def test_timeouts_and_wait_for_use_virtual_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(10.0):
                await asyncio.sleep(100.0)
        t1 = loop.time()
        ev = asyncio.Event()
        loop.call_later(7.0, ev.set)
        await asyncio.wait_for(ev.wait(), timeout=60.0)
        return t1, loop.time()

    assert run_virtual(main(), start=100.0) == (110.0, 117.0)


def test_deadlock_is_reported() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationDeadlockError):
        run_virtual(main())


def test_events_are_counted() -> None:
    loop = VirtualTimeEventLoop()
    try:
        loop.run_until_complete(asyncio.sleep(1.0))
        assert loop.callbacks_scheduled >= 1
        assert loop.time() == 1.0
    finally:
        loop.close()


def _trace(slow: float) -> list[tuple[float, int]]:
    """A small program whose callbacks optionally burn real time."""

    async def main() -> list[tuple[float, int]]:
        loop = asyncio.get_running_loop()
        out: list[tuple[float, int]] = []

        async def worker(i: int) -> None:
            for k in range(5):
                if slow:
                    t = time.perf_counter()
                    while time.perf_counter() - t < slow:  # burn wall-clock time
                        pass
                await asyncio.sleep(0.1 * ((i * 7 + k * 3) % 5 + 1))
                out.append((loop.time(), i))

        await asyncio.gather(*(worker(i) for i in range(6)))
        return out

    return run_virtual(main())


def test_results_do_not_depend_on_machine_speed() -> None:
    assert _trace(0.0) == _trace(0.002)
