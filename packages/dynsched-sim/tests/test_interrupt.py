"""Ctrl-C inside a simulated run: raised between two loop iterations, never inside a task.

Before, SIGINT raised `KeyboardInterrupt` wherever the program was: inside a task's step
(coroutines created and never awaited), or inside the loop between taking a callback off
its ready queue and running it (that task never ran again: cancelling the run's tasks
never ended, or ended in a deadlock leaving suspended coroutines finalised after the loop
was gone, printing "no current event loop"). About one ``dynsched simulate`` interrupt in
nine printed such noise and one in forty hung.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import warnings
from typing import Any

import pytest
from dynsched_sim import load_scenario, run_configuration
from dynsched_sim._vloop import VirtualTimeEventLoop, deferred_interrupts, run_virtual


@pytest.fixture
def noise() -> Any:
    """What a run printed as unraisable errors and warnings (collected after a gc)."""
    unraisable: list[Any] = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield unraisable, caught
        gc.collect()
    sys.unraisablehook = old_hook
    assert [u.exc_value for u in unraisable] == []
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


@pytest.mark.parametrize("at_step", [1, 3, 7])
def test_sigint_in_a_running_simulation_stops_it_between_iterations(
    at_step: int, noise: Any
) -> None:
    sc = load_scenario("balanced").with_steps(8)
    after: list[int] = []

    def progress(step: int, total: int, t: float) -> None:
        if step == at_step:
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside a task
            after.append(step)  # before: KeyboardInterrupt was raised above instead

    with pytest.raises(KeyboardInterrupt):
        run_configuration(sc, sc.configurations[-1].name, "default", progress=progress)
    assert after == [at_step]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # the next run is not disturbed
    assert run_configuration(sc, sc.configurations[-1].name, "default").summary["steps"] == 8


def test_sigint_while_the_loop_is_not_running_is_raised_at_the_end() -> None:
    loop = VirtualTimeEventLoop()
    ran = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts(loop):
        signal.raise_signal(signal.SIGINT)
        ran.append(1)  # not interrupted here: the interrupt is kept, not lost
    loop.close()
    assert ran == [1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_run_virtual_cancels_every_task_on_sigint(noise: Any) -> None:
    started: list[str] = []

    async def worker(name: str) -> None:
        started.append(name)
        await asyncio.sleep(1e9)

    async def main() -> None:
        tasks = [asyncio.create_task(worker(f"w{i}")) for i in range(5)]
        await asyncio.sleep(1.0)
        signal.raise_signal(signal.SIGINT)
        # Created but not yet run: before, the interrupt left these coroutines never awaited.
        tasks += [asyncio.create_task(worker(f"late{i}")) for i in range(3)]
        await asyncio.gather(*tasks)

    with pytest.raises(KeyboardInterrupt):
        run_virtual(main())
    assert len(started) == 5


def test_another_sigint_handler_is_left_alone() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        loop = VirtualTimeEventLoop()
        with deferred_interrupts(loop):
            signal.raise_signal(signal.SIGINT)
        loop.close()
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
