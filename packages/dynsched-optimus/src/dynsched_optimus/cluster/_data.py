"""Loading the vendored Pollux workloads and GPU job profiles.

The data (Apache-2.0, see ``shared/data/pollux/NOTICE``) is never copied into the
package: it is found through the ``DYNSCHED_POLLUX_DATA`` environment variable or by
walking up from this file to a directory that holds ``shared/data/pollux``.

Throughput interpolation (documented in ``docs/cluster.md``):

1. A placement is the tuple of GPUs used on each node, zeros dropped, normalised to
   its lexicographically smallest rotation (``(1, 3)`` and ``(3, 1)`` are the same).
2. When ``placements.csv`` measured that placement, step and sync time are linearly
   interpolated in the local batch size between the measured local batch sizes
   (clamped at the ends).
3. Otherwise a piecewise-linear interpolation over ``(num_nodes, num_replicas,
   local_bsz)`` on the Delaunay triangulation of every measured point
   (``placements.csv`` averaged per ``(num_nodes, num_replicas, local_bsz)`` plus
   ``scalability.csv``) is used, ``num_nodes`` capped at 16; outside the convex hull
   the nearest measured point in log space is used.
"""

from __future__ import annotations

import csv
import functools
import math
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
from scipy.interpolate import LinearNDInterpolator

__all__ = [
    "POLLUX_ENV_VAR",
    "POLLUX_MODELS",
    "WORKLOAD_LOADS",
    "GpuJobSpec",
    "ModelProfile",
    "PolluxDataError",
    "available_workloads",
    "find_pollux_data",
    "load_profiles",
    "load_workload",
]

POLLUX_ENV_VAR = "DYNSCHED_POLLUX_DATA"

#: Per-model settings taken from the Pollux artifact's simulator configuration (facts,
#: not code): number of training epochs the traces cover and the largest local batch
#: that fits in one GPU where it differs from the largest profiled one.
POLLUX_MODELS: dict[str, dict[str, int]] = {
    "bert": {"max_epochs": 2},
    "cifar10": {"max_epochs": 100},
    "ncf": {"max_epochs": 10},
    "imagenet": {"max_epochs": 90},
    "deepspeech2": {"max_epochs": 80},
    "yolov3": {"max_epochs": 50, "max_local_bsz": 8},
}

_WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
_PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
_SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
_VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")


class PolluxDataError(ValueError):
    """A vendored Pollux file is missing or malformed (the message names the file)."""


def find_pollux_data(start: str | os.PathLike[str] | None = None) -> Path:
    """Locate the vendored Pollux data directory.

    Args:
        start: directory to walk up from; defaults to this module's directory.

    Returns:
        The directory holding ``workloads/`` and ``traces/``.

    Raises:
        PolluxDataError: when neither ``DYNSCHED_POLLUX_DATA`` nor a
            ``shared/data/pollux`` directory above ``start`` exists.
    """
    env = os.environ.get(POLLUX_ENV_VAR)
    if env:
        path = Path(env)
        if not path.is_dir():
            raise PolluxDataError(f"{POLLUX_ENV_VAR}={env!r} is not a directory")
        return path
    here = Path(start) if start is not None else Path(__file__).resolve().parent
    for parent in (here, *here.parents):
        candidate = parent / "shared" / "data" / "pollux"
        if candidate.is_dir():
            return candidate
    raise PolluxDataError(
        f"Pollux data not found: set {POLLUX_ENV_VAR} to the directory holding "
        f"workloads/ and traces/, or place it at <ancestor>/shared/data/pollux "
        f"(searched upwards from {here})"
    )


def _read_csv(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    if not path.is_file():
        raise PolluxDataError(f"missing file: {path}")
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in columns if c not in header]
            if missing:
                raise PolluxDataError(
                    f"{path}: missing column(s) {missing}; expected {list(columns)}, got {header}"
                )
            rows = list(reader)
    except UnicodeDecodeError as exc:
        raise PolluxDataError(f"{path}: not a text CSV file ({exc})") from exc
    if not rows:
        raise PolluxDataError(f"{path}: no data rows")
    return rows


def _num(path: Path, row_no: int, row: dict[str, str], col: str, kind: type = float) -> float:
    raw = row.get(col)
    try:
        value = kind(raw) if kind is float else int(float(raw))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PolluxDataError(
            f"{path}: row {row_no + 2}, column {col!r}: {raw!r} is not a number"
        ) from None
    if not math.isfinite(value):
        raise PolluxDataError(f"{path}: row {row_no + 2}, column {col!r}: {raw!r} is not finite")
    return value


@attrs.frozen
class GpuJobSpec:
    """One job of a Pollux workload.

    Attributes:
        name: unique job name.
        submit_time: submission time in seconds.
        application: model name (one of ``POLLUX_MODELS``).
        num_replicas: requested GPU count (used by gang schedulers such as Tiresias, FIFO).
        batch_size: submitted global batch size.
    """

    name: str
    submit_time: float
    application: str
    num_replicas: int
    batch_size: int


#: Folder of each relative job load (``--load``) under the Pollux data directory.
WORKLOAD_LOADS = {
    "1.0": "workloads",
    "0.5": "workloads-0.5",
    "1.5": "workloads-1.5",
    "2.0": "workloads-2.0",
    "realistic": "workloads-realistic",
}


def available_workloads(load: str = "1.0", *, root: Path | None = None) -> list[str]:
    """Names of the vendored Pollux workloads of one job load (e.g. ``workload-1``).

    Raises:
        PolluxDataError: unknown load, or the data directory is not found.
    """
    if load not in WORKLOAD_LOADS:
        raise PolluxDataError(f"load={load!r}: allowed values are {sorted(WORKLOAD_LOADS)}")
    folder = (root or find_pollux_data()) / WORKLOAD_LOADS[load]
    if not folder.is_dir():
        return []
    names = [p.stem for p in folder.glob("*.csv")]
    return sorted(names, key=lambda n: (len(n), n))


def load_workload(
    workload: str | os.PathLike[str], *, load: str = "1.0", root: Path | None = None
) -> list[GpuJobSpec]:
    """Load one Pollux workload CSV.

    Args:
        workload: a path to a CSV file, or a name such as ``"workload-3"`` / ``"3"``.
        load: relative job load when ``workload`` is a name: ``"1.0"``, ``"0.5"``,
            ``"1.5"``, ``"2.0"`` or ``"realistic"``.
        root: data directory (default: :func:`find_pollux_data`).

    Returns:
        Jobs sorted by submission time (ties by name).

    Raises:
        PolluxDataError: missing or malformed file, unknown load or application.
    """
    path = Path(workload)
    if path.is_dir():
        raise PolluxDataError(f"workload {str(workload)!r} is a directory, not a .csv file")
    if path.suffix != ".csv":
        name = str(workload)
        if not name.startswith("workload-"):
            name = f"workload-{name}"
        if load not in WORKLOAD_LOADS:
            raise PolluxDataError(f"load={load!r}: allowed values are {sorted(WORKLOAD_LOADS)}")
        folder = (root or find_pollux_data()) / WORKLOAD_LOADS[load]
        path = folder / f"{name}.csv"
        if not path.is_file():
            names = available_workloads(load, root=root)
            raise PolluxDataError(
                f"unknown workload {str(workload)!r} (load {load}); available: "
                f"{', '.join(names) or 'none'}, or a path to a .csv file"
            )
    rows = _read_csv(path, _WORKLOAD_COLUMNS)
    jobs = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        app = row["application"]
        if app not in POLLUX_MODELS:
            raise PolluxDataError(
                f"{path}: row {i + 2}: unknown application {app!r}; allowed {sorted(POLLUX_MODELS)}"
            )
        if row["name"] in seen:
            raise PolluxDataError(f"{path}: row {i + 2}: duplicate job name {row['name']!r}")
        seen.add(row["name"])
        spec = GpuJobSpec(
            name=row["name"],
            submit_time=_num(path, i, row, "time"),
            application=app,
            num_replicas=int(_num(path, i, row, "num_replicas", int)),
            batch_size=int(_num(path, i, row, "batch_size", int)),
        )
        if spec.num_replicas < 1 or spec.batch_size < 1 or spec.submit_time < 0:
            raise PolluxDataError(
                f"{path}: row {i + 2}: num_replicas and batch_size must be >= 1, time >= 0"
            )
        jobs.append(spec)
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return jobs


def _norm_placement(placement: Sequence[int]) -> tuple[int, ...]:
    p = tuple(int(x) for x in placement if x)
    if not p:
        return p
    return min(p[i:] + p[:i] for i in range(len(p)))


class ModelProfile:
    """Measured profile of one Pollux model: throughput and validation curves.

    Args:
        trace_dir: ``traces/<model>`` directory.
        max_epochs: epochs covered (``POLLUX_MODELS``); defaults to the shortest file.
        max_local_bsz: largest local batch per GPU; defaults to the largest profiled.
        target_metric: completion target; ``None`` selects the default target: the
            least good, over the profiled batch sizes, of the best metric each reaches
            within ``max_epochs`` (so every batch size can reach it).

    Raises:
        PolluxDataError: missing or malformed files.
    """

    def __init__(
        self,
        trace_dir: Path,
        *,
        max_epochs: int | None = None,
        max_local_bsz: int | None = None,
        target_metric: float | None = None,
    ) -> None:
        self.name = trace_dir.name
        self.trace_dir = trace_dir
        if not trace_dir.is_dir():
            raise PolluxDataError(f"missing profile directory: {trace_dir}")
        vfiles = sorted(trace_dir.glob("validation-*.csv"))
        if not vfiles:
            raise PolluxDataError(f"{trace_dir}: no validation-<batch>.csv file")
        val: dict[int, np.ndarray] = {}
        for f in vfiles:
            try:
                bsz = int(f.stem.split("-", 1)[1])
            except ValueError:
                raise PolluxDataError(
                    f"{f}: file name must be validation-<batch size>.csv"
                ) from None
            rows = _read_csv(f, _VALIDATION_COLUMNS)
            val[bsz] = np.array(
                [[_num(f, i, r, c) for c in _VALIDATION_COLUMNS] for i, r in enumerate(rows)]
            )
        self.batch_sizes = np.array(sorted(val), dtype=np.int64)
        n_ep = min(len(v) for v in val.values())
        self.max_epochs = min(max_epochs or n_ep, n_ep)
        ep = self.max_epochs
        self._progress = np.stack([val[b][:ep, 0] for b in self.batch_sizes])
        self._iteration = np.stack([val[b][:ep, 1] for b in self.batch_sizes])
        self._metric = np.stack([val[b][:ep, 2] for b in self.batch_sizes])
        self._grad_sqr = np.stack([val[b][:ep, 3] for b in self.batch_sizes])
        self._grad_var = np.stack([val[b][:ep, 4] for b in self.batch_sizes])
        #: progress (in initial-batch-equivalent steps) at the end of each epoch
        self.epoch_progress = self._progress.min(axis=0)
        first = self._metric[0]
        self.higher_is_better = bool(first[0] < first[-1])
        if target_metric is None:
            best = self._best_metric_table()[:, -1]
            target_metric = float(best.min() if self.higher_is_better else best.max())
        self.target_metric = float(target_metric)
        self.init_batch_size = int(self.batch_sizes[0])
        self.max_batch_size = int(self.batch_sizes[-1])

        ppath = trace_dir / "placements.csv"
        prows = _read_csv(ppath, _PLACEMENT_COLUMNS)
        self._measured: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
        pts: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
        for i, r in enumerate(prows):
            digits = r["placement"].strip()
            if not digits.isdigit():
                raise PolluxDataError(f"{ppath}: row {i + 2}: placement {digits!r} is not digits")
            pl = _norm_placement([int(c) for c in digits])
            lb, st, sy = (_num(ppath, i, r, c) for c in ("local_bsz", "step_time", "sync_time"))
            self._measured.setdefault(pl, []).append((lb, st, sy))
            pts.setdefault((len(pl), sum(pl), lb), []).append((st, sy))
        for v in self._measured.values():
            v.sort()
        spath = trace_dir / "scalability.csv"
        srows = _read_csv(spath, _SCALABILITY_COLUMNS)
        xs = [[k[0], k[1], k[2]] for k in pts]
        ys = [list(np.mean(v, axis=0)) for v in pts.values()]
        for i, r in enumerate(srows):
            xs.append([_num(spath, i, r, c) for c in ("num_nodes", "num_replicas", "local_bsz")])
            ys.append([_num(spath, i, r, c) for c in ("step_time", "sync_time")])
        self._xs = np.array(xs, dtype=float)
        self._ys = np.array(ys, dtype=float)
        self._lin = LinearNDInterpolator(self._xs, self._ys)
        self._logxs = np.log(self._xs)
        self.min_local_bsz = int(min(k[2] for k in pts))
        self.max_local_bsz = int(max_local_bsz or max(k[2] for k in pts))
        self.throughput = functools.lru_cache(maxsize=65536)(self._throughput)
        #: cached ``(batch_size, epoch) -> gain``, see :meth:`_efficiency_gain`
        self.efficiency_gain = functools.lru_cache(maxsize=65536)(self._efficiency_gain)

    def __repr__(self) -> str:
        return f"ModelProfile({self.name!r}, epochs={self.max_epochs}, target={self.target_metric})"

    # ---- validation curves -------------------------------------------------------
    def _best_metric_table(self) -> np.ndarray:
        if self.higher_is_better:
            return np.maximum.accumulate(self._metric, axis=1)
        return np.minimum.accumulate(self._metric, axis=1)

    def _bracket(self, batch_size: float) -> tuple[int, int, float]:
        b = float(min(max(batch_size, self.batch_sizes[0]), self.batch_sizes[-1]))
        hi = int(np.searchsorted(self.batch_sizes, b, side="left"))
        if self.batch_sizes[hi] == b:
            return hi, hi, 0.0
        lo = hi - 1
        w = (b - self.batch_sizes[lo]) / (self.batch_sizes[hi] - self.batch_sizes[lo])
        return lo, hi, float(w)

    def _interp(self, table: np.ndarray, batch_size: float, epoch: int) -> float:
        lo, hi, w = self._bracket(batch_size)
        e = min(max(epoch, 0), self.max_epochs - 1)
        return float((1 - w) * table[lo, e] + w * table[hi, e])

    def metric(self, batch_size: float, epoch: int) -> float:
        """Validation metric after epoch ``epoch`` (0-based) at ``batch_size``."""
        return self._interp(self._metric, batch_size, epoch)

    def iterations(self, batch_size: float, epochs: int) -> float:
        """Cumulative iterations after ``epochs`` completed epochs at ``batch_size``."""
        if epochs <= 0:
            return 0.0
        return self._interp(self._iteration, batch_size, epochs - 1)

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """Gradient square norm and variance measured during epoch ``epoch``."""
        return (
            self._interp(self._grad_sqr, batch_size, epoch),
            self._interp(self._grad_var, batch_size, epoch),
        )

    @functools.cache  # noqa: B019 - profiles live for the whole process
    def completion_epochs(self, batch_size: int, mode: str = "target") -> int:
        """Number of epochs a job with this batch size trains before it is complete.

        Args:
            batch_size: global batch size.
            mode: ``"target"``: the first epoch whose validation metric reaches
                :attr:`target_metric` (capped at ``max_epochs``); ``"epochs"``: all
                ``max_epochs`` epochs (the Pollux artifact's rule).
        """
        if mode == "epochs":
            return self.max_epochs
        if mode != "target":
            raise ValueError(f"mode={mode!r}: allowed values are 'target', 'epochs'")
        for e in range(self.max_epochs):
            m = self.metric(batch_size, e)
            if (m >= self.target_metric) if self.higher_is_better else (m <= self.target_metric):
                return e + 1
        return self.max_epochs

    def _efficiency_gain(self, batch_size: float, epoch: int) -> float:
        """Statistical efficiency of ``batch_size`` relative to the initial batch, times scale.

        ``gain = (var + sqr) / (var / s + sqr)`` with ``s = batch / init_batch``: progress
        (in initial-batch steps) made by one step at ``batch_size``; 1 <= gain <= s.
        """
        sqr, var = self.grad_stats(batch_size, epoch)
        scale = batch_size / self.init_batch_size
        return (var + sqr) / (var / scale + sqr)

    # ---- throughput ----------------------------------------------------------------
    def _throughput(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        pl = _norm_placement(placement)
        if not pl:
            raise ValueError("empty placement")
        meas = self._measured.get(pl)
        if meas is not None:
            arr = np.array(meas)
            st = float(np.interp(local_bsz, arr[:, 0], arr[:, 1]))
            sy = float(np.interp(local_bsz, arr[:, 0], arr[:, 2]))
            return st, sy
        x = np.array([min(len(pl), 16), sum(pl), local_bsz], dtype=float)
        y = self._lin(x[None, :])[0]
        if not np.all(np.isfinite(y)):
            d = np.abs(self._logxs - np.log(x)).sum(axis=1)
            y = self._ys[int(np.argmin(d))]
        return float(y[0]), float(y[1])

    def step_config(self, num_replicas: int, batch_size: int) -> tuple[int, int, int]:
        """Local batch per step, gradient-accumulation steps and effective global batch.

        Returns:
            ``(atomic_bsz, accum_steps, effective_batch)`` for ``num_replicas`` GPUs.
        """
        local = math.ceil(batch_size / num_replicas - 1e-8)
        accum = max(math.ceil(local / self.max_local_bsz - 1e-8) - 1, 0)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = max(min(atomic, self.max_batch_size // (num_replicas * (accum + 1))), 1)
        return atomic, accum, atomic * (accum + 1) * num_replicas

    def max_replicas(self, batch_size: int) -> int:
        """Most GPUs a job with this global batch can use (local batch >= min local)."""
        return max(1, batch_size // self.min_local_bsz)

    def iter_time(self, placement: tuple[int, ...], batch_size: int) -> float:
        """Seconds per optimizer iteration on ``placement`` at global ``batch_size``."""
        r = sum(placement)
        atomic, accum, _ = self.step_config(r, batch_size)
        st, sy = self.throughput(_norm_placement(placement), float(atomic))
        return st + accum * max(st - sy, 0.0)


def load_profiles(
    root: Path | None = None, *, targets: dict[str, float] | None = None
) -> dict[str, ModelProfile]:
    """Load every model profile under ``<root>/traces``.

    Args:
        root: data directory (default: :func:`find_pollux_data`).
        targets: optional target metric per model (default targets otherwise).

    Raises:
        PolluxDataError: a profile directory or one of its files is missing or malformed.
    """
    root = root or find_pollux_data()
    out = {}
    for name, cfg in POLLUX_MODELS.items():
        out[name] = _cached_profile(
            str(root / "traces" / name),
            cfg.get("max_epochs"),
            cfg.get("max_local_bsz"),
            (targets or {}).get(name),
        )
    return out


@functools.lru_cache(maxsize=64)
def _cached_profile(
    path: str, max_epochs: int | None, max_local_bsz: int | None, target: float | None
) -> ModelProfile:
    return ModelProfile(
        Path(path), max_epochs=max_epochs, max_local_bsz=max_local_bsz, target_metric=target
    )
