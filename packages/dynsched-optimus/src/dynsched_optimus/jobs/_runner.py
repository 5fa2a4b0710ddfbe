"""Run one worker of a job: the script in a thread, its events in a queue.

:class:`JobRunner` is what a Ray actor of the service wraps (one per worker) and what
:func:`run_local` uses to try a script on this machine. A worker of a multi-worker job
joins the job's torch.distributed group (gloo on CPU, NCCL on GPU) before its script
runs and leaves it after.
"""

from __future__ import annotations

import datetime
import logging
import os
import queue
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import attrs

from dynsched_optimus.jobs._context import (
    ContextOptions,
    JobContext,
    JobContractError,
    _install,
)
from dynsched_optimus.jobs._spec import JobSpec

__all__ = ["JobRunner", "LocalResult", "one_line_error", "run_local"]

logger = logging.getLogger(__name__)

#: bound of one collective of a job's group: a dead peer fails the step instead of hanging
#: (judgement: far above a tiny job's step, short enough for a restart to follow)
COLLECTIVE_TIMEOUT_S = 60.0


def one_line_error(exc: BaseException, script: str) -> str:
    """``Type: message (script.py, line N)``: the innermost frame of the script named."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.abspath(frame.filename) == os.path.abspath(script):
            where = f" ({Path(script).name}, line {frame.lineno})"
            break
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}{where}"


class JobRunner:
    """Runs a job script as one worker (rank) and collects its events.

    Args:
        options: the worker's context options.
        script: the training script.
        rendezvous: ``(host, port)`` of rank 0's group store (``world_size > 1``).
    """

    def __init__(
        self, options: ContextOptions, script: str, rendezvous: tuple[str, int] | None = None
    ) -> None:
        self.options = options
        self.script = script
        self.rendezvous = rendezvous
        self._events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._batch: int | None = None
        self._thread: threading.Thread | None = None

    # Control protocol (the context's side)
    def stop_requested(self) -> bool:
        """Whether a stop was requested."""
        return self._stop.is_set()

    def requested_batch(self) -> int | None:
        """The global batch the host asked for (None: none asked)."""
        return self._batch

    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event with this worker's rank and a wall-clock time."""
        self._events.put({**event, "rank": self.options.rank, "t": time.time()})

    # host side
    def start(self) -> None:
        """Start the script in a daemon thread."""
        self._thread = threading.Thread(target=self._main, name="dynsched-job", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the job to checkpoint and stop at its next step."""
        self._stop.set()

    def request_batch(self, batch: int) -> None:
        """Ask the job to train with global ``batch`` from a step all its ranks agree on
        (a job with ``batch_change: in_place``; others ignore it).

        Raises:
            JobContractError: ``batch`` is not an integer >= 1.
        """
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise JobContractError(f"batch must be an integer >= 1, got {batch!r}")
        self._batch = batch

    def poll(self) -> list[dict[str, Any]]:
        """The events queued since the last poll (``report``, ``checkpoint``, ``batch``,
        ``exit``)."""
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    @property
    def running(self) -> bool:
        """Whether the script is still running."""
        return self._thread is not None and self._thread.is_alive()

    def _join_group(self) -> None:
        import torch
        import torch.distributed as dist

        if self.rendezvous is None:
            raise JobContractError("a job with world_size > 1 needs rank 0's address")
        host, port = self.rendezvous
        dist.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo",
            init_method=f"tcp://{host}:{port}",
            rank=self.options.rank,
            world_size=self.options.world_size,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )

    def _main(self) -> None:
        ctx = JobContext(self.options, self)
        exit_event: dict[str, Any] = {"kind": "exit"}
        grouped = self.options.world_size > 1
        try:
            if grouped:
                self._join_group()
            _install(ctx)
            self._run_script()
            if not (ctx.finished or ctx.stopped_early):
                raise JobContractError(
                    f"the script returned at step {ctx.step} before the job was done "
                    "(loop `while not ctx.should_stop()`)"
                )
        except BaseException as exc:  # the script's error, in one line, to the host
            exit_event["error"] = one_line_error(exc, self.script)
        finally:
            _install(None)
            if grouped:
                self._leave_group()
            exit_event.update(finished=ctx.finished, step=ctx.step, reports=ctx.reports)
            self.emit(exit_event)

    def _run_script(self) -> None:
        """The script as ``__main__``, its folder importable; ``sys.exit(0)`` is a return."""
        folder = str(Path(self.script).resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            runpy.run_path(self.script, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise

    @staticmethod
    def _leave_group() -> None:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as exc:  # the job's own result stands; leaving is best effort
            logger.debug("leaving the job's process group failed: %r", exc)


@attrs.frozen
class LocalResult:
    """What :func:`run_local` saw.

    Attributes:
        reports: the ``report`` events (step, loss, samples, dt).
        checkpoints: the ``checkpoint`` events (step, path).
        finished: whether the completion rule was met.
    """

    reports: tuple[dict[str, Any], ...]
    checkpoints: tuple[dict[str, Any], ...]
    finished: bool


def _local_options(spec: JobSpec, checkpoint_dir: str, restore: str | None) -> ContextOptions:
    return ContextOptions(
        job_name=spec.name,
        rank=0,
        world_size=1,
        batch_size=spec.batch_size,
        completion=spec.completion,
        checkpoint_every=spec.checkpoint_every,
        checkpoint_dir=checkpoint_dir,
        restore_path=restore,
        args=spec.args,
        batch_change=spec.batch_change,
    )


def run_local(
    spec: JobSpec,
    checkpoint_dir: str,
    *,
    restore_path: str | None = None,
    poll_s: float = 0.05,
) -> LocalResult:
    """Run ``spec``'s script as one worker in this process, to try it out.

    Raises:
        JobContractError: the script raised (one line) or sent no report for
            ``spec.report_timeout_s`` seconds.
    """
    runner = JobRunner(_local_options(spec, checkpoint_dir, restore_path), spec.script)
    runner.start()
    events: list[dict[str, Any]] = []
    last = time.monotonic()
    while True:
        new = runner.poll()
        events += new
        if any(e["kind"] == "report" for e in new):
            last = time.monotonic()
        done = [e for e in new if e["kind"] == "exit"]
        if done:
            if "error" in done[0]:
                raise JobContractError(f"job {spec.name!r}: {done[0]['error']}")
            break
        if time.monotonic() - last > spec.report_timeout_s:
            runner.request_stop()
            raise JobContractError(silent_error(spec))
        time.sleep(poll_s)
    return LocalResult(
        tuple(e for e in events if e["kind"] == "report"),
        tuple(e for e in events if e["kind"] == "checkpoint"),
        bool(done[0]["finished"]),
    )


def silent_error(spec: JobSpec) -> str:
    """The one line of a job that never reported within its bound."""
    return (
        f"job {spec.name!r} sent no report for {spec.report_timeout_s:g} s "
        "(report_timeout_s): call ctx.report(step=..., loss=...) every step"
    )
