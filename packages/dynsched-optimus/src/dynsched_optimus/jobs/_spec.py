"""The job file a user submits: what to run, with how many workers, until when.

A job file is YAML, JSON or TOML (read through dynsched-core's guarded loader)::

    name: mlp                       # unique among the jobs of a service
    script: mlp.py                  # the training script (relative to the job file)
    batch_size: 64                  # global batch; each worker gets batch_size / world_size
    workers: 2                      # requested workers (the scheduler's prior)
    max_workers: 4                  # most workers the job can use (default: workers)
    completion: {target_loss: 0.1} # or {steps: 500}
    resources: {CPU: 1}             # per worker (GPU: a count, bookkeeping on CPU)
    checkpoint_every: 50            # steps between periodic checkpoints
    report_timeout_s: 120           # a job silent this long fails with a clear error
    args: {hidden: 64}              # free-form, handed to the script as ``ctx.args``
    adaptive_batch: {max_batch: 512, max_local: 128}  # optional: the scheduler picks the batch
    batch_change: in_place          # how a new batch applies: restart (default) or in_place

``adaptive_batch`` (the names of :class:`~dynsched_optimus.scheduler.AdaptiveBatch`) lets
``optimus+`` choose the job's global batch between ``init_batch`` (default: ``batch_size``)
and ``max_batch``, at least ``min_local`` (default 1) per worker, micro-batches of at most
``max_local`` per worker (default: no limit); the job then reports gradient statistics
(``ctx.report(grad_sqr=, grad_var=)``) and must end at a ``target_loss`` (a job of N steps
is counted in steps whatever its batch, so its batch stays fixed, as in the simulator).
Such a job may get up to ``max_batch // min_local`` workers (Pollux's limit), so
``max_workers`` defaults to that and may not be below it. ``batch_change: in_place``
says the script reads ``ctx.batch_size`` every step: a new batch on the same placement
then applies at a step boundary without a restart; ``restart`` (the default) restarts
the job from its last checkpoint with the new batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from dynsched_optimus._goodput import AdaptiveBatch
from dynsched_optimus._io import InputFileError
from dynsched_optimus._observation import CompletionRule

__all__ = [
    "ADAPTIVE_BATCH_KEYS",
    "BATCH_CHANGES",
    "COMPLETION_KEYS",
    "RESOURCE_NAMES",
    "JobSpec",
    "load_job_file",
    "parse_job",
]

#: the resources a worker may ask for, in the order of the scheduler's demand vectors
RESOURCE_NAMES: tuple[str, ...] = ("CPU", "GPU")
#: the keys of a job file's ``completion`` mapping and the rule each becomes
COMPLETION_KEYS: dict[str, str] = {"target_loss": "target_metric", "steps": "steps"}
#: how a new batch chosen by the scheduler reaches a running job (first: the default)
BATCH_CHANGES: tuple[str, ...] = ("restart", "in_place")
#: the keys of a job file's ``adaptive_batch`` mapping (:class:`AdaptiveBatch`'s names)
ADAPTIVE_BATCH_KEYS: tuple[str, ...] = ("init_batch", "max_batch", "min_local", "max_local")
_FIELDS = (
    "name",
    "script",
    "batch_size",
    "workers",
    "max_workers",
    "completion",
    "resources",
    "checkpoint_every",
    "report_timeout_s",
    "args",
    "adaptive_batch",
    "batch_change",
)


def _positive_int(name: str, least: int = 1) -> Callable[[Any, Any, Any], None]:
    def check(_inst: object, _attr: object, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"field {name!r} must be an integer >= {least}, got {value!r}")

    return check


@attrs.frozen
class JobSpec:
    """One submitted job (frozen options record; see the module docstring for the file).

    Attributes:
        name: unique job name (letters, digits, ``-``, ``_``, ``.``).
        script: absolute path of the training script.
        batch_size: global batch size.
        workers: requested workers.
        max_workers: most workers the job can use.
        completion: when the job is done (``target_metric``: a target loss, or ``steps``).
        resources: per-worker demand, one value per :data:`RESOURCE_NAMES`.
        checkpoint_every: steps between periodic checkpoints.
        report_timeout_s: seconds without a report after which the job fails.
        args: free-form arguments of the script.
        adaptive_batch: the batch range the scheduler may choose from (no gradient
            statistics, no progress: those come from the job's reports); None: fixed.
        batch_change: one of :data:`BATCH_CHANGES`.
    """

    name: str
    script: str
    batch_size: int = attrs.field(validator=_positive_int("batch_size"))
    workers: int = attrs.field(default=1, validator=_positive_int("workers"))
    max_workers: int = attrs.field(default=0, validator=_positive_int("max_workers", 0))
    completion: CompletionRule = attrs.field(factory=lambda: CompletionRule("steps", 100))
    resources: tuple[float, ...] = (1.0, 0.0)
    checkpoint_every: int = attrs.field(default=50, validator=_positive_int("checkpoint_every"))
    report_timeout_s: float = 120.0
    args: Mapping[str, Any] = attrs.field(factory=dict)
    adaptive_batch: AdaptiveBatch | None = None
    batch_change: str = BATCH_CHANGES[0]

    def __attrs_post_init__(self) -> None:
        ok = self.name and all(c.isalnum() or c in "-_." for c in self.name)
        if not ok:
            raise ValueError(
                f"field 'name' must be non-empty letters, digits, '-', '_' or '.', got {self.name!r}"
            )
        if self.batch_change not in BATCH_CHANGES:
            raise ValueError(
                f"field 'batch_change' must be one of {list(BATCH_CHANGES)}, "
                f"got {self.batch_change!r}"
            )
        if self.adaptive_batch is not None:
            self._check_adaptive(self.adaptive_batch)
        if self.max_workers == 0:
            object.__setattr__(self, "max_workers", self.workers)
        if self.max_workers < self.workers:
            raise ValueError(
                f"field 'max_workers' must be >= workers ({self.workers}), got {self.max_workers}"
            )
        if self.completion.kind not in COMPLETION_KEYS.values():
            raise ValueError(
                f"field 'completion' must be one of {sorted(COMPLETION_KEYS)}, "
                f"got {self.completion.kind!r}"
            )
        if not (math.isfinite(self.report_timeout_s) and self.report_timeout_s > 0):
            raise ValueError(f"field 'report_timeout_s' must be > 0, got {self.report_timeout_s}")

    def _check_adaptive(self, ab: AdaptiveBatch) -> None:
        """The batch range against the rest of the job (``max_workers`` set from it)."""
        if not isinstance(ab, AdaptiveBatch):
            raise ValueError("field 'adaptive_batch' must be an AdaptiveBatch or None")
        if ab.has_stats or ab.progress or ab.progress_points:
            raise ValueError(
                "field 'adaptive_batch' is the batch range only: gradient statistics and "
                "progress come from the job's reports"
            )
        if not ab.init_batch <= self.batch_size <= ab.max_batch:
            raise ValueError(
                f"field 'batch_size' ({self.batch_size}) must lie in adaptive_batch's "
                f"[init_batch, max_batch] = [{ab.init_batch:g}, {ab.max_batch:g}]"
            )
        if self.completion.kind != "target_metric":
            raise ValueError(
                "field 'adaptive_batch' needs completion {target_loss: X}: a job of N steps "
                "is counted in steps whatever its batch, so the scheduler keeps its batch"
            )
        top = max(ab.max_workers, self.workers)
        if self.max_workers == 0:
            object.__setattr__(self, "max_workers", top)
        if self.max_workers < ab.max_workers:
            raise ValueError(
                f"field 'max_workers' ({self.max_workers}) must be >= adaptive_batch's "
                f"max_batch // min_local ({ab.max_workers}), the workers a goodput job may "
                "get: raise adaptive_batch.min_local or leave max_workers out"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the inverse of :func:`parse_job` with ``base=None``)."""
        kind = {v: k for k, v in COMPLETION_KEYS.items()}[self.completion.kind]
        return {
            "name": self.name,
            "script": self.script,
            "batch_size": self.batch_size,
            "workers": self.workers,
            "max_workers": self.max_workers,
            "completion": {kind: self.completion.value},
            "resources": dict(zip(RESOURCE_NAMES, self.resources, strict=True)),
            "checkpoint_every": self.checkpoint_every,
            "report_timeout_s": self.report_timeout_s,
            "args": dict(self.args),
            **({} if self.adaptive_batch is None else {"adaptive_batch": self._range()}),
            "batch_change": self.batch_change,
        }

    def _range(self) -> dict[str, float]:
        ab = self.adaptive_batch
        assert ab is not None
        out = {"init_batch": ab.init_batch, "max_batch": ab.max_batch, "min_local": ab.min_local}
        if ab.max_local is not None:
            out["max_local"] = ab.max_local
        return out


def _completion(value: object) -> CompletionRule:
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError(f"field 'completion' must be one of {{{', '.join(COMPLETION_KEYS)}: N}}")
    (key, v), *_ = value.items()
    if key not in COMPLETION_KEYS:
        raise ValueError(
            f"field 'completion' must be one of {sorted(COMPLETION_KEYS)}, got {key!r}"
        )
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"field 'completion.{key}' must be a number, got {v!r}")
    try:
        return CompletionRule(COMPLETION_KEYS[key], v)
    except ValueError as exc:
        raise ValueError(str(exc).replace("completion.value", f"completion.{key}")) from None


def _resources(value: object) -> tuple[float, ...]:
    if not isinstance(value, Mapping):
        raise ValueError(f"field 'resources' must be a mapping of {list(RESOURCE_NAMES)}")
    unknown = sorted(set(value) - set(RESOURCE_NAMES))
    if unknown:
        raise ValueError(f"field 'resources': unknown {unknown}; allowed {list(RESOURCE_NAMES)}")
    out = []
    for name in RESOURCE_NAMES:
        v = value.get(name, 0.0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
            raise ValueError(f"field 'resources.{name}' must be a number >= 0, got {v!r}")
        out.append(float(v))
    if sum(out) <= 0:
        raise ValueError("field 'resources' must ask for some resource")
    return tuple(out)


def parse_job(data: object, base: Path | None = None) -> JobSpec:
    """Check a job mapping and build its :class:`JobSpec`.

    Args:
        data: the file's mapping.
        base: directory a relative ``script`` is resolved against (None: as given).

    Raises:
        ValueError: one line naming the field and what it may be.
    """
    if not isinstance(data, Mapping):
        raise ValueError("a job file must hold a mapping (name, script, batch_size, ...)")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; allowed: {list(_FIELDS)}")
    for need in ("name", "script", "batch_size"):
        if need not in data:
            raise ValueError(f"field {need!r} is required")
    kw = dict(data)
    script = kw.pop("script")
    if not isinstance(script, str) or not script:
        raise ValueError(f"field 'script' must be a path, got {script!r}")
    path = Path(script) if base is None else (base / script)
    if base is not None and not path.is_file():
        raise ValueError(f"field 'script': no such file {str(path)!r}")
    if "completion" in kw:
        kw["completion"] = _completion(kw["completion"])
    if "resources" in kw:
        kw["resources"] = _resources(kw["resources"])
    if not isinstance(kw.get("args", {}), Mapping):
        raise ValueError("field 'args' must be a mapping")
    try:
        json.dumps(kw.get("args", {}), allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError(
            "field 'args' must be plain data (strings, numbers, lists, mappings)"
        ) from None
    if "report_timeout_s" in kw:
        kw["report_timeout_s"] = _number("report_timeout_s", kw["report_timeout_s"])
    if "adaptive_batch" in kw:
        kw["adaptive_batch"] = _adaptive(kw["adaptive_batch"], kw["batch_size"])
    name = kw.pop("name")
    return JobSpec(str(name), str(path.resolve() if base is not None else path), **kw)


def _adaptive(value: object, batch_size: object) -> AdaptiveBatch:
    """``adaptive_batch: {init_batch, max_batch, min_local, max_local}`` (``max_batch``
    required; ``init_batch`` defaults to the job's ``batch_size``)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"field 'adaptive_batch' must be a mapping of {list(ADAPTIVE_BATCH_KEYS)}")
    unknown = sorted(str(k) for k in set(value) - set(ADAPTIVE_BATCH_KEYS))
    if unknown:
        raise ValueError(
            f"field 'adaptive_batch': unknown {unknown}; allowed {list(ADAPTIVE_BATCH_KEYS)}"
        )
    if "max_batch" not in value:
        raise ValueError("field 'adaptive_batch.max_batch' is required")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"field 'batch_size' must be an integer >= 1, got {batch_size!r}")
    kw = {"init_batch": batch_size, **value}
    for key, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"field 'adaptive_batch.{key}' must be a number > 0, got {v!r}")
    return AdaptiveBatch(**kw)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"field {name!r} must be a number, got {value!r}")
    return float(value)


def load_job_file(path: str | Path) -> JobSpec:
    """Read and check a job file.

    Raises:
        InputFileError: one line naming the file and the field.
    """
    from dynsched_core._errors import ConfigError
    from dynsched_core._loading import read_config_file

    p = Path(path)
    try:
        data = read_config_file(p)
    except FileNotFoundError:
        raise InputFileError(p, "no such file") from None
    except (ConfigError, OSError) as exc:
        raise InputFileError(p, str(exc).splitlines()[0]) from None
    try:
        return parse_job(data, base=p.resolve().parent)
    except (ValueError, TypeError) as exc:
        raise InputFileError(p, str(exc).splitlines()[0]) from None
