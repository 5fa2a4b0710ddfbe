"""The job contract: what a training script sees of the scheduler (``jobs.context()``).

A script reads its rank, world size and batch, reports every step, checkpoints when
asked and stops when told::

    ctx = jobs.context()
    state = ctx.restore()                   # None on a fresh start
    step = 0 if state is None else state["step"]
    while not ctx.should_stop():
        loss = train_one_step(ctx.local_batch_size)
        step += 1
        ctx.report(step=step, loss=loss, samples=ctx.batch_size)
        if ctx.should_checkpoint():
            ctx.save({"step": step, "model": model.state_dict()})

``report`` is a collective when ``world_size > 1`` (every rank calls it every step): the
loss is averaged over the ranks and the stop flag is agreed, so every rank checkpoints
and stops at the same step. Checkpoints are written by rank 0 (torch's format when torch
is installed, else pickle) and read by every rank, as plain data only: a checkpoint file
that would run code when loaded is refused (`CheckpointError`), nothing of it run.

A job whose file says ``batch_change: in_place`` may get a new global batch while it runs
(the service asks every rank through :meth:`Control.requested_batch`): the same collective
carries each rank's requested batch, and the batch switches after the step in which every
rank asked for the same one, from the next step on, on every rank at once. Rank 0 emits a
``batch`` event naming the last step of the old batch. A script that reads
``ctx.batch_size``/``ctx.local_batch_size`` every step follows it.
"""

from __future__ import annotations

import collections
import math
import os
import pickle
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from dynsched_optimus._errors import OptimusError
from dynsched_optimus._observation import CompletionRule

__all__ = [
    "BatchControl",
    "CheckpointError",
    "ContextOptions",
    "Control",
    "JobContext",
    "JobContractError",
    "agreed_batch",
    "context",
    "load_checkpoint",
    "save_checkpoint",
]

#: reported losses averaged to decide a ``target_loss`` completion (judgement: 5 steps
#: smooth the step-to-step noise of a small batch without delaying the end much)
LOSS_WINDOW = 5


class JobContractError(OptimusError):
    """A job broke the contract (never reported, called it outside a job, bad value)."""


class Control(Protocol):
    """The host's side of a running job: a stop flag in, events out."""

    def stop_requested(self) -> bool:
        """Whether the host asked the job to checkpoint and stop."""
        ...

    def emit(self, event: dict[str, Any]) -> None:
        """Hand one event (``report``, ``checkpoint``, ``batch``) to the host."""
        ...


class BatchControl(Control, Protocol):
    """A host that may change a running job's batch (``batch_change: in_place``)."""

    def requested_batch(self) -> int | None:
        """The global batch the host asks this rank to train with (None: keep it)."""
        ...


@attrs.frozen
class ContextOptions:
    """Where and how one worker of a job runs (plain data, sent to the worker).

    Attributes:
        job_name: the job.
        rank: this worker's rank.
        world_size: workers of the job now.
        batch_size: global batch size.
        completion: when the job is done.
        checkpoint_every: steps between periodic checkpoints.
        checkpoint_dir: where rank 0 writes checkpoints.
        restore_path: the checkpoint to resume from (None: a fresh start).
        args: the job file's ``args``.
        batch_change: the job file's ``batch_change`` (``in_place``: the batch may change
            while the job runs, agreed in :meth:`JobContext.report`).
    """

    job_name: str
    rank: int
    world_size: int
    batch_size: int
    completion: CompletionRule
    checkpoint_every: int = 50
    checkpoint_dir: str = "."
    restore_path: str | None = None
    args: Mapping[str, Any] = attrs.field(factory=dict)
    batch_change: str = "restart"


def save_checkpoint(obj: Any, path: str) -> None:
    """Write ``obj`` to ``path`` atomically (torch's format when torch is importable)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        import torch
    except ImportError:
        with open(tmp, "wb") as fh:
            pickle.dump(obj, fh)
    else:
        torch.save(obj, tmp)
    os.replace(tmp, path)


#: What a checkpoint read without torch may name besides plain data (dicts, lists, tuples,
#: strings, numbers, bytes): numpy arrays, dtypes and scalars, and three builtin types.
#: Anything else, e.g. a function pickle would call while loading, is refused.
_PLAIN_GLOBALS = frozenset(
    {
        ("builtins", "complex"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytearray"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
    }
)


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain data only (see `_PLAIN_GLOBALS`): nothing in the file is run."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN_GLOBALS or (
            module == "numpy.dtypes" and name.endswith("DType")
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}")


class CheckpointError(pickle.UnpicklingError, ValueError):
    """A checkpoint file that is not plain data (refused, nothing in it was run), or that
    cannot be read (a `pickle.UnpicklingError`, as torch's own refusal is, and a
    `ValueError`)."""


def load_checkpoint(path: str) -> Any:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors, numbers, dicts).

    Only plain data is read, with or without torch (``torch.load(weights_only=True)``;
    without torch, pickle restricted to plain data and numpy arrays): a file that would
    run code when loaded is refused and nothing of it is executed.

    Raises:
        CheckpointError: the file is not such a checkpoint, or is unreadable (one line
            naming the file).
    """
    try:
        import torch
    except ImportError:
        try:
            with open(path, "rb") as fh:
                return _PlainUnpickler(fh).load()
        except (pickle.UnpicklingError, EOFError, ValueError, AttributeError) as exc:
            raise CheckpointError(
                f"checkpoint {path!r} is not plain data (refused, nothing in it was run): "
                f"{str(exc)[:200] or type(exc).__name__}"
            ) from None
    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        # torch's refusal names the offending global (its advice to load the file anyway
        # is not repeated)
        found = re.search(
            r"Unsupported global: GLOBAL (\S+)", re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        )
        why = f"it names {found.group(1)}" if found else f"unreadable ({type(exc).__name__})"
        raise CheckpointError(
            f"checkpoint {path!r} is not a plain tensor checkpoint (refused, nothing in it "
            f"was run): {why[:200]}"
        ) from None


def _all_reduce_sum(values: list[float]) -> list[float]:
    """Sum ``values`` over the ranks of the job's torch.distributed group."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return [float(x) for x in t.tolist()]


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


class JobContext:
    """One worker's view of its job (see the module docstring).

    Args:
        options: rank, world size, batch, completion rule, checkpoint places.
        control: the host's stop flag and event sink.
        reduce: sums a list of floats over the ranks (default: torch.distributed).
    """

    def __init__(
        self,
        options: ContextOptions,
        control: Control,
        reduce: Callable[[list[float]], list[float]] | None = None,
    ) -> None:
        self.options = options
        self._control = control
        self._reduce = reduce or _all_reduce_sum
        self._losses: collections.deque[float] = collections.deque(maxlen=LOSS_WINDOW)
        self._step = 0
        self._stop = False
        self._saved_step: int | None = None
        self._last_t = time.monotonic()
        self.start_step = 0
        self.reports = 0
        self._batch = int(options.batch_size)
        asks = getattr(control, "requested_batch", None)
        in_place = options.batch_change == "in_place"
        self._asks: Callable[[], int | None] | None = asks if in_place else None

    @property
    def rank(self) -> int:
        """This worker's rank."""
        return self.options.rank

    @property
    def world_size(self) -> int:
        """Workers of the job now."""
        return self.options.world_size

    @property
    def batch_size(self) -> int:
        """The global batch size of the next step (it changes in place only between steps,
        on every rank at once)."""
        return self._batch

    @property
    def local_batch_size(self) -> int:
        """This worker's share of the global batch (at least 1)."""
        return max(self._batch // self.options.world_size, 1)

    @property
    def args(self) -> Mapping[str, Any]:
        """The job file's ``args``."""
        return self.options.args

    @property
    def step(self) -> int:
        """The last reported step."""
        return self._step

    @property
    def finished(self) -> bool:
        """Whether the completion rule is met by what was reported."""
        rule = self.options.completion
        if rule.kind == "steps":
            return self._step >= rule.value
        full = len(self._losses) == self._losses.maxlen
        return full and sum(self._losses) / len(self._losses) <= rule.value

    def restore(self) -> Any:
        """The state saved by the last checkpoint, or None on a fresh start."""
        path = self.options.restore_path
        if path is None:
            return None
        saved = load_checkpoint(path)
        self.start_step = self._step = int(saved["step"])
        return saved["state"]

    def report(
        self,
        *,
        step: int,
        loss: float,
        samples: int | None = None,
        grad_sqr: float | None = None,
        grad_var: float | None = None,
    ) -> float:
        """Report one step (every rank, every step); returns the loss averaged over ranks.

        Raises:
            JobContractError: a non-finite loss or a step that does not increase.
        """
        loss = float(loss)
        if not math.isfinite(loss):
            raise JobContractError(f"job {self.options.job_name!r}: loss at step {step} is {loss}")
        if int(step) <= self._step and self.reports:
            raise JobContractError(
                f"job {self.options.job_name!r}: step {step} reported after step {self._step}"
            )
        stop = 1.0 if self._control.stop_requested() else 0.0
        ask = self._asked()
        if self.world_size > 1:
            sent = [loss, stop] if self._asks is None else [loss, stop, ask, ask * ask]
            total, stop, *asked = self._reduce(sent)
            loss = total / self.world_size
            ask = agreed_batch(asked, self.world_size, self._batch)
        self._step, self.reports = int(step), self.reports + 1
        self._stop = self._stop or stop > 0
        self._losses.append(loss)
        if self.rank == 0:
            now = time.monotonic()
            event = {"kind": "report", "step": self._step, "loss": loss, "dt": now - self._last_t}
            event["samples"] = self._batch if samples is None else int(samples)
            event["batch"] = self._batch
            if grad_sqr is not None and grad_var is not None:
                event.update(grad_sqr=float(grad_sqr), grad_var=float(grad_var))
            self._last_t = now
            self._control.emit(event)
        if ask != self._batch:
            self._switch(int(ask))
        return loss

    def _asked(self) -> float:
        """The batch this rank is asked to train with (its own when nothing is asked)."""
        if self._asks is None:
            return float(self._batch)
        want = self._asks()
        if want is None or isinstance(want, bool) or int(want) < 1:
            return float(self._batch)
        return float(int(want))

    def _switch(self, batch: int) -> None:
        """Train with ``batch`` from the next step (every rank at the same step)."""
        old, self._batch = self._batch, batch
        if self.rank == 0:
            self._control.emit({"kind": "batch", "step": self._step, "batch": batch, "old": old})

    def should_checkpoint(self) -> bool:
        """Whether to :meth:`save` now (periodically, and before a requested stop)."""
        if self._saved_step == self._step:
            return False
        return self._stop or self._step % self.options.checkpoint_every == 0

    def save(self, state: Any) -> None:
        """Save ``state`` as the checkpoint of the last reported step (every rank calls it;
        rank 0 writes)."""
        if self.rank == 0:
            path = os.path.join(self.options.checkpoint_dir, f"step-{self._step:09d}.ckpt")
            os.makedirs(self.options.checkpoint_dir, exist_ok=True)
            save_checkpoint({"step": self._step, "state": state}, path)
            self._control.emit({"kind": "checkpoint", "step": self._step, "path": path})
        if self.world_size > 1:
            _barrier()
        self._saved_step = self._step

    def should_stop(self) -> bool:
        """Whether the loop should end: the job is done, or it was asked to stop and has
        saved its state."""
        return self.finished or (self._stop and self._saved_step == self._step)

    @property
    def stopped_early(self) -> bool:
        """Whether the job ends because the host asked (not because it is done)."""
        return self._stop and not self.finished


def agreed_batch(asked: list[float], world_size: int, current: int) -> int:
    """The batch every rank switches to after a step: ``asked`` holds the sums over the
    ranks of each rank's requested batch and of its square (empty: nothing to agree).

    All ranks asked for the same batch exactly when ``world_size * sum(b**2) ==
    sum(b)**2`` (Cauchy-Schwarz); then it is ``sum(b) / world_size``, else the batch stays.
    Every rank computes this from the same reduced sums, so the ranks never disagree.
    """
    if len(asked) != 2:
        return current
    total, squares = (round(x) for x in asked)  # integers below 2**26: exact in float64
    if total <= 0 or world_size * squares != total * total or total % world_size:
        return current
    return total // world_size


_CURRENT: JobContext | None = None
_LOCK = threading.Lock()


def _install(ctx: JobContext | None) -> None:
    global _CURRENT
    with _LOCK:
        _CURRENT = ctx


def context() -> JobContext:
    """The running job's context (call it from a script the service or ``run_local`` runs).

    Raises:
        JobContractError: outside a job.
    """
    ctx = _CURRENT
    if ctx is None:
        raise JobContractError(
            "jobs.context() called outside a dynsched optimus job: submit the script with "
            "`dynsched optimus submit JOB.yaml` or run it with dynsched_optimus.jobs.run_local"
        )
    return ctx
