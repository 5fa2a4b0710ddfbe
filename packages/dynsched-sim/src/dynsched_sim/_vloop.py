"""A virtual-time asyncio event loop.

`VirtualTimeEventLoop` is a plain `asyncio.BaseEventLoop` whose clock is a number kept
by the loop itself. When no callback is ready, instead of blocking in a selector until
the next timer is due, the loop *jumps* its clock to that timer. Coroutines written for
asyncio (``asyncio.sleep``, ``asyncio.wait_for``, ``asyncio.timeout``, futures, tasks,
queues, ...) therefore run unchanged, hours of simulated time in seconds of real time,
and nothing in a simulated run ever reads the wall clock: two runs of the same program
produce the same results on a fast or a slow machine.

The loop does no I/O: sockets, subprocesses, signal handlers and thread pools are not
supported (a simulation has no use for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

__all__ = [
    "SimulationDeadlockError",
    "VirtualTimeEventLoop",
    "deferred_interrupts",
    "run_virtual",
]

_T = TypeVar("_T")


class SimulationDeadlockError(RuntimeError):
    """Nothing is runnable and no timer is pending: the simulated program can never progress."""


class _VirtualSelector:
    """Stands in for the selector: 'waiting' means moving the virtual clock."""

    def __init__(self, loop: VirtualTimeEventLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        # The one safe point of a loop iteration: no callback has been taken off the
        # ready queue yet, so an interrupt raised here loses none (see `deferred_interrupts`).
        if self._loop._interrupt_pending:
            self._loop._interrupt_pending = False
            raise KeyboardInterrupt
        self._loop._advance(timeout)
        return []

    def close(self) -> None:
        pass

    def get_map(self) -> dict[Any, Any]:
        return {}


class VirtualTimeEventLoop(asyncio.BaseEventLoop):
    """An asyncio event loop on virtual time.

    Args:
        start: Initial value of the virtual clock, in seconds.

    Attributes:
        callbacks_scheduled: Number of callbacks scheduled so far (``call_soon`` and
            timers): the simulation's event count.
    """

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._vtime = float(start)
        # The base class reads the real clock's resolution; fix it so timer batching
        # never depends on the machine.
        self._clock_resolution = 1e-9
        self._selector = _VirtualSelector(self)
        self.callbacks_scheduled = 0
        self._interrupt_pending = False

    def request_interrupt(self) -> None:
        """Raise `KeyboardInterrupt` out of the running loop at its next safe point (between
        two iterations, never inside a callback or a task's step). Safe to call from a
        signal handler."""
        self._interrupt_pending = True

    # --- clock -----------------------------------------------------------------------
    def time(self) -> float:
        """The virtual clock, in seconds."""
        return self._vtime

    def _advance(self, timeout: float | None) -> None:
        if timeout is None:
            raise SimulationDeadlockError(
                f"virtual time {self._vtime:.6f} s: no callback is ready and no timer is pending"
            )
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if timeout > 0 and scheduled:
            when = scheduled[0].when()
            if when > self._vtime:
                self._vtime = when

    # --- scheduling (counted) --------------------------------------------------------
    def _call_soon(
        self,
        callback: Callable[..., object],
        args: Any,
        context: contextvars.Context | None,
    ) -> asyncio.Handle:
        self.callbacks_scheduled += 1
        handle: asyncio.Handle = super()._call_soon(callback, args, context)  # type: ignore[misc]
        return handle

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        self.callbacks_scheduled += 1
        return super().call_at(when, callback, *args, context=context)

    # --- no I/O --------------------------------------------------------------------
    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def run_in_executor(self, executor: Any, func: Callable[..., _T], *args: Any) -> Any:  # type: ignore[override]
        raise NotImplementedError("VirtualTimeEventLoop runs no threads (simulated time only)")


@contextlib.contextmanager
def deferred_interrupts(loop: VirtualTimeEventLoop) -> Iterator[None]:
    """Deliver Ctrl-C to ``loop`` at a safe point instead of wherever the program happens to be.

    Python raises `KeyboardInterrupt` between any two bytecodes: inside a task's step
    (leaving coroutines created but never awaited), or inside the loop between taking a
    callback off its ready queue and running it (that task then never runs again, so
    cancelling the run's tasks afterwards never ends, or ends in a deadlock that leaves
    suspended coroutines to be finalised after the loop is gone: "no current event
    loop"). While this context is active, SIGINT only asks the loop to stop
    (`VirtualTimeEventLoop.request_interrupt`), and the loop raises `KeyboardInterrupt`
    at the start of its next iteration. An interrupt that arrives while the loop is not
    running is raised when the context exits, so none is ever lost.

    Only the default SIGINT handler (raise `KeyboardInterrupt`) on the main thread is
    replaced; elsewhere, or under another handler, this does nothing.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        loop.request_interrupt()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if loop._interrupt_pending:  # it came while the loop was not running
            loop._interrupt_pending = False
            raise KeyboardInterrupt


def run_virtual(main: Coroutine[Any, Any, _T], *, start: float = 0.0) -> _T:
    """Run ``main`` to completion on a fresh `VirtualTimeEventLoop` and close the loop.

    Like `asyncio.run`, pending tasks are cancelled when ``main`` returns.

    Args:
        main: The coroutine to run.
        start: Initial virtual time.

    Returns:
        What ``main`` returned.

    Raises:
        SimulationDeadlockError: the program waits on something that can never happen.
    """
    loop = VirtualTimeEventLoop(start=start)
    with deferred_interrupts(loop):
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(main)
        except BaseException:
            # Ctrl-C (or an error) tears the program down: the errors of the tasks cancelled
            # below are consequences, not news; log them at debug level instead of printing.
            loop.set_exception_handler(_quiet)
            raise
        finally:
            try:
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    logger.debug("while stopping: %s", context.get("message"))


def stop_quietly(loop: VirtualTimeEventLoop) -> None:
    """Cancel every pending task of an interrupted ``loop``; their errors are logged at
    debug level, not printed (they are consequences of the interrupt)."""
    loop.set_exception_handler(_quiet)
    try:
        _cancel_all(loop)
    except BaseException as exc:  # a second interrupt, or a task refusing to stop
        logger.debug("while cancelling the tasks of an interrupted run: %r", exc)


def _cancel_all(loop: VirtualTimeEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
