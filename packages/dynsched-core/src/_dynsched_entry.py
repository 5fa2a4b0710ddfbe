"""The ``dynsched`` console script: Ctrl-C at any moment ends in one line and exit status 130.

A top-level module (not inside the ``dynsched_core`` package) so that nothing is imported
before the interrupt handling below is in place: the generated script's first import is
this module, and the package's import (about 0.15 s) happens inside `main`'s ``try``.

- Ctrl-C while the dispatcher and the sub-command's package are imported: one line,
  ``dynsched: interrupted``, exit status 130 (before, Python printed a traceback).
- Ctrl-C while the sub-command runs: the dispatcher's own handling
  (`dynsched_core.cli.main`): one ``interrupted`` line, exit status 130. One that lands
  in a finaliser or an at-fork hook, where Python would print it and carry on, is sent
  again (`_redeliver_swallowed_interrupts`).
- A command that used Ray ends without the interpreter's module teardown (see
  `_exit_without_teardown`): no segmentation fault after its last line.
- Ctrl-C after the sub-command returned, while the interpreter shuts down (atexit
  handlers, joining threads, finalising Ray's or vLLM's objects): the process exits at
  once with status 130, after flushing its output, instead of printing a traceback from
  inside a finaliser or waiting for the shutdown to end.
"""

# No `from __future__ import annotations` either: it imports a module too.
# Only modules the interpreter has loaded before any script runs: an import here would
# be a moment where Ctrl-C prints a traceback. Everything else is imported in `main`.
import os
import sys

__all__ = ["main"]

#: Exit status after Ctrl-C (128 + SIGINT); `dynsched_core.cli.EXIT_INTERRUPTED`.
_EXIT_INTERRUPTED = 130


def main() -> int:
    """Run the ``dynsched`` dispatcher; see the module docstring for Ctrl-C."""
    said = False  # the command said "interrupted" itself
    try:
        import signal

        _redeliver_swallowed_interrupts()
        from dynsched_core.cli import main as dispatch

        status = dispatch()
        said = status == _EXIT_INTERRUPTED
        # The command is over. A Ctrl-C from here on ends the process at once: nothing of
        # the command is left to stop, and a KeyboardInterrupt raised inside an atexit
        # handler or a finaliser would only print a traceback.
        if _on_main_thread():

            def exit_now(signum: int, frame: object) -> None:
                _exit_at_once(say=not said)

            signal.signal(signal.SIGINT, exit_now)
    except KeyboardInterrupt:
        # while importing (nothing has started, nothing to clean up), or right after the
        # command returned
        _exit_at_once(say=not said)
        return _EXIT_INTERRUPTED  # not reached
    if "ray" in sys.modules:
        _exit_without_teardown(int(status))
    return status


def _exit_without_teardown(status: int) -> None:
    """Finish as the interpreter would, but skip its teardown of the modules.

    After ``ray.shutdown()``, threads of Ray's C++ core worker (gRPC) can still run while
    the interpreter frees the modules and objects they use: a segmentation fault after the
    command's last line (seen in 2 of 11 interrupted ``dynsched run`` commands). So the
    non-daemon threads are joined and the atexit handlers run (logging flushed, temporary
    folders removed, Ray's own handlers), as at a normal exit, and then the process ends
    with ``os._exit``.
    """
    import atexit
    import contextlib
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    with contextlib.suppress(Exception):  # they print their own errors, as at a normal exit
        atexit._run_exitfuncs()
    _flush()
    os._exit(status)


def _redeliver_swallowed_interrupts() -> None:
    """Deliver again a Ctrl-C that landed where Python ignores exceptions.

    A `KeyboardInterrupt` raised inside a finaliser (``__del__``, a weakref callback) or
    an at-fork hook (``logging`` runs one each time a process is started, as Ray does
    while it starts) is printed as "Exception ignored in ..." with a traceback, and the
    command runs on as if never interrupted (seen once in 20 interrupted ``dynsched
    run``). Such an interrupt is sent again from a helper thread, so it lands once the
    finaliser has returned, and nothing is printed for it.
    """
    import queue
    import signal
    import threading
    import time

    pending: queue.SimpleQueue[None] = queue.SimpleQueue()

    def resend() -> None:  # started beforehand: the hook itself only puts (C code)
        while True:
            pending.get()
            time.sleep(0.02)  # let the finaliser return first (if not: sent once more)
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=resend, name="dynsched-resend-sigint", daemon=True).start()
    previous = sys.unraisablehook

    def hook(unraisable: object) -> None:
        if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
            pending.put(None)
            return
        previous(unraisable)  # type: ignore[arg-type]

    sys.unraisablehook = hook


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _flush() -> None:
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing to say
            stream.flush()


def _exit_at_once(*, say: bool = True) -> None:
    import contextlib

    _flush()
    if say:
        with contextlib.suppress(OSError):
            os.write(2, b"dynsched: interrupted\n")
    os._exit(_EXIT_INTERRUPTED)
