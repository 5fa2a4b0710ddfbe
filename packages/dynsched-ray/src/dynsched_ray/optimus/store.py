"""The service's durable state: jobs, what they reported, their checkpoints (SQLite).

Every submitted job is a row of ``jobs`` before the service sees it (``submit`` writes it,
from any process); the service appends ``reports`` (with the step's batch and gradient
statistics), ``speeds`` (steps/s per workers, nodes and batch), ``checkpoints`` and
``batch_changes`` as its workers send them, and moves the job's ``state`` and current
``batch``. A restarted service reads the table back
and resumes every job that was not done from its last checkpoint: nothing submitted is
lost. SQLite's write-ahead log lets ``status``/``submit``/``cancel`` run beside ``serve``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
from dynsched_optimus import JobPlacement
from dynsched_optimus._errors import OptimusError
from dynsched_optimus.jobs import (
    JobRecord,
    JobSpec,
    bucket_loss_points,
    parse_job,
    progress_by_step,
)

__all__ = ["ACTIVE_STATES", "BATCH_HOW", "STATES", "JobRow", "JobStore", "status_lines"]

#: a job's life: queued -> running (-> stopping -> queued: a re-allocation) -> finished,
#: failed or cancelled
STATES: tuple[str, ...] = ("queued", "running", "stopping", "finished", "failed", "cancelled")
#: the states of a job that is not done
ACTIVE_STATES: tuple[str, ...] = ("queued", "running", "stopping")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL, submitted REAL NOT NULL,
    started REAL, ended REAL, error TEXT, restarts INTEGER NOT NULL DEFAULT 0,
    cancel INTEGER NOT NULL DEFAULT 0, placement TEXT, remaining REAL, batch INTEGER
);
CREATE TABLE IF NOT EXISTS reports (
    name TEXT NOT NULL, t REAL NOT NULL, step INTEGER NOT NULL, loss REAL NOT NULL,
    samples INTEGER NOT NULL, batch REAL, grad_sqr REAL, grad_var REAL
);
CREATE INDEX IF NOT EXISTS reports_name ON reports (name, step);
CREATE TABLE IF NOT EXISTS speeds (
    name TEXT NOT NULL, workers INTEGER NOT NULL, nodes INTEGER NOT NULL, batch REAL NOT NULL,
    steps_per_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    name TEXT NOT NULL, step INTEGER NOT NULL, path TEXT NOT NULL, t REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_changes (
    name TEXT NOT NULL, step INTEGER NOT NULL, old INTEGER NOT NULL, new INTEGER NOT NULL,
    how TEXT NOT NULL, t REAL NOT NULL
);
"""
#: columns added after the first release: a table written by it gains them on open
_ADDED = {
    "jobs": (("batch", "INTEGER"),),
    "reports": (("batch", "REAL"), ("grad_sqr", "REAL"), ("grad_var", "REAL")),
}
#: how a batch change reached a job (``batch_changes.how``): switched while running, by a
#: checkpoint-restart, or when the job (re)started
BATCH_HOW: tuple[str, ...] = ("in_place", "restart", "start")


@attrs.frozen
class JobRow:
    """One row of the job table (what ``status`` shows); ``batch`` is the global batch the
    job trains with now (its spec's until the scheduler changes it)."""

    name: str
    spec: JobSpec
    state: str
    submitted: float
    started: float | None
    ended: float | None
    error: str | None
    restarts: int
    cancel: bool
    placement: JobPlacement | None
    remaining: float | None
    batch: int


def _placement_json(pl: JobPlacement | None) -> str | None:
    if pl is None:
        return None
    return json.dumps([pl.job_id, pl.nodes, pl.ps_per_node, pl.workers_per_node])


def _placement(text: str | None) -> JobPlacement | None:
    if text is None:
        return None
    jid, nodes, ps, ws = json.loads(text)
    return JobPlacement(jid, tuple(nodes), tuple(ps), tuple(ws))


#: the columns of a job's row, in the order ``JobStore._row`` reads them
_JOB_COLUMNS = (
    "name, spec, state, submitted, started, ended, error, restarts, cancel, "
    "placement, remaining, batch"
)


class JobStore:
    """The SQLite job table (one connection per store; thread-safe within a process).

    Args:
        path: the database file (created with its tables when missing).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._specs: dict[str, JobSpec] = {}
        self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """Add the columns of :data:`_ADDED` a table written by an older release lacks."""
        with self._tx() as db:
            for table, cols in _ADDED.items():
                have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
                for col, kind in cols:
                    if col not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {col} {kind}")

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._db:
            yield self._db

    def submit(self, spec: JobSpec, now: float | None = None) -> None:
        """Add a queued job.

        Raises:
            OptimusError: a job of that name exists (it names the job).
        """
        t = time.time() if now is None else now
        try:
            with self._tx() as db:
                db.execute(
                    "INSERT INTO jobs (name, spec, state, submitted) VALUES (?, ?, 'queued', ?)",
                    (spec.name, json.dumps(spec.to_dict()), t),
                )
        except sqlite3.IntegrityError:
            raise OptimusError(f"a job named {spec.name!r} was already submitted") from None

    def request_cancel(self, name: str) -> None:
        """Mark a job for cancelling (the service stops it at its next round).

        Raises:
            OptimusError: no such job.
        """
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET cancel = 1 WHERE name = ?", (name,))
        if cur.rowcount == 0:
            raise OptimusError(f"no job named {name!r}")

    def jobs(self, states: Sequence[str] = STATES) -> list[JobRow]:
        """The jobs in ``states``, in submission order."""
        marks = ",".join("?" * len(states))
        with self._tx() as db:
            rows = db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state IN ({marks}) "  # nosec B608: fixed column list, values bound
                "ORDER BY submitted, name",
                tuple(states),
            ).fetchall()
        return [self._row(r) for r in rows]

    def job(self, name: str) -> JobRow:
        """One job's row (one query: the service reads it for every job on every poll).

        Raises:
            KeyError: no job is called ``name``.
        """
        with self._tx() as db:
            r = db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE name = ?",  # nosec B608: fixed column list, values bound
                (name,),
            ).fetchone()
        if r is None:
            raise KeyError(f"no job {name!r}")
        return self._row(r)

    def _row(self, r: Sequence[Any]) -> JobRow:
        spec = self._spec(r[1])
        return JobRow(
            name=r[0],
            spec=spec,
            state=r[2],
            submitted=r[3],
            started=r[4],
            ended=r[5],
            error=r[6],
            restarts=r[7],
            cancel=bool(r[8]),
            placement=_placement(r[9]),
            remaining=r[10],
            batch=spec.batch_size if r[11] is None else int(r[11]),
        )

    def _spec(self, text: str) -> JobSpec:
        """The job spec of a row (parsed once: a job's spec never changes)."""
        spec = self._specs.get(text)
        if spec is None:
            spec = self._specs[text] = parse_job(json.loads(text))
        return spec

    def update(self, name: str, **fields: Any) -> None:
        """Set columns of a job (``state``, ``started``, ``ended``, ``error``, ``restarts``,
        ``placement``, ``remaining``, ``batch``)."""
        allowed = {
            "state",
            "started",
            "ended",
            "error",
            "restarts",
            "placement",
            "remaining",
            "batch",
        }
        bad = sorted(set(fields) - allowed)
        if bad:
            raise OptimusError(f"unknown job column(s) {bad}; allowed {sorted(allowed)}")
        if "state" in fields and fields["state"] not in STATES:
            raise OptimusError(f"state {fields['state']!r}: allowed values are {list(STATES)}")
        if "placement" in fields:
            fields["placement"] = _placement_json(fields["placement"])
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {cols} WHERE name = ?", (*fields.values(), name))  # nosec B608: columns checked against the allowlist above, values bound

    def add_reports(self, name: str, reports: Sequence[dict[str, Any]]) -> None:
        """Append ``report`` events (step, loss, samples, t; optional: the step's global
        ``batch``, default ``samples``, and ``grad_sqr``/``grad_var``)."""
        rows = [
            (
                name,
                e["t"],
                e["step"],
                e["loss"],
                e["samples"],
                e.get("batch", e["samples"]),
                e.get("grad_sqr"),
                e.get("grad_var"),
            )
            for e in reports
        ]
        with self._tx() as db:
            db.executemany(
                "INSERT INTO reports (name, t, step, loss, samples, batch, grad_sqr, grad_var) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def add_batch_change(self, name: str, step: int, old: int, new: int, how: str) -> None:
        """Record that a job's batch changed from ``old`` to ``new`` after ``step``
        (``how``: one of :data:`BATCH_HOW`)."""
        if how not in BATCH_HOW:
            raise OptimusError(f"how={how!r}: allowed values are {list(BATCH_HOW)}")
        with self._tx() as db:
            db.execute(
                "INSERT INTO batch_changes (name, step, old, new, how, t) VALUES (?, ?, ?, ?, ?, ?)",
                (name, int(step), int(old), int(new), how, time.time()),
            )

    def batch_changes(self, name: str) -> list[tuple[int, int, int, str]]:
        """``(step, old, new, how)`` of every batch change of a job, in order."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT step, old, new, how FROM batch_changes WHERE name = ? ORDER BY rowid",
                (name,),
            ).fetchall()
        return [(int(a), int(b), int(c), str(d)) for a, b, c, d in rows]

    def samples(self, name: str) -> list[tuple[int, int]]:
        """``(step, samples)`` of every report of a job, in order."""
        return [(s, int(n)) for s, n in self._by_step(name, "samples")]

    def _by_step(self, name: str, column: str) -> list[tuple[int, Any]]:
        """``(step, column)`` of every report of a job, in order (``column``: a name
        this module passes)."""
        with self._tx() as db:
            rows = db.execute(
                f"SELECT step, {column} FROM reports WHERE name = ? ORDER BY rowid",  # nosec B608: a column name of this module, values bound
                (name,),
            ).fetchall()
        return [(int(s), v) for s, v in rows]

    def add_speed(self, name: str, workers: int, nodes: int, batch: float, speed: float) -> None:
        """Append one throughput sample (steps/s) of a configuration."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO speeds (name, workers, nodes, batch, steps_per_s) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, workers, nodes, batch, speed),
            )

    def add_checkpoint(self, name: str, step: int, path: str, t: float) -> None:
        """Index a checkpoint rank 0 wrote."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO checkpoints (name, step, path, t) VALUES (?, ?, ?, ?)",
                (name, step, path, t),
            )

    def latest_checkpoint(self, name: str) -> tuple[int, str] | None:
        """``(step, path)`` of the job's last checkpoint whose file exists, or None."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT step, path FROM checkpoints WHERE name = ? ORDER BY step DESC", (name,)
            ).fetchall()
        for step, path in rows:
            if Path(path).is_file():
                return int(step), str(path)
        return None

    def last_report(self, name: str) -> tuple[int, float] | None:
        """``(step, loss)`` of the job's last report, or None."""
        with self._tx() as db:
            row = db.execute(
                "SELECT step, loss FROM reports WHERE name = ? ORDER BY rowid DESC LIMIT 1",
                (name,),
            ).fetchone()
        return None if row is None else (int(row[0]), float(row[1]))

    def last_speed(self, name: str) -> float | None:
        """The job's latest throughput sample (steps/s), or None."""
        with self._tx() as db:
            row = db.execute(
                "SELECT steps_per_s FROM speeds WHERE name = ? ORDER BY rowid DESC LIMIT 1",
                (name,),
            ).fetchone()
        return None if row is None else float(row[0])

    def losses(self, name: str) -> list[tuple[int, float]]:
        """All ``(step, loss)`` reports of a job, in order."""
        return [(s, float(v)) for s, v in self._by_step(name, "loss")]

    def reports(self, name: str) -> list[tuple[float, int, float]]:
        """All ``(t, step, loss)`` reports of a job in arrival order (``t``: wall clock)."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT t, step, loss FROM reports WHERE name = ? ORDER BY rowid", (name,)
            ).fetchall()
        return [(float(t), int(s), float(v)) for t, s, v in rows]

    def speeds(self, name: str) -> list[tuple[int, int, float, float]]:
        """All ``(workers, nodes, batch, steps/s)`` throughput samples of a job, in order."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT workers, nodes, batch, steps_per_s FROM speeds WHERE name = ? "
                "ORDER BY rowid",
                (name,),
            ).fetchall()
        return [(int(w), int(n), float(b), float(v)) for w, n, b, v in rows]

    def record(self, row: JobRow) -> JobRecord:
        """The job's measurements as the scheduler's input (:class:`JobRecord`)."""
        return self.records([row])[0]

    def _grouped(self, sql: str, names: Sequence[str]) -> dict[str, list[tuple[Any, ...]]]:
        marks = ",".join("?" * len(names))
        with self._tx() as db:
            rows = db.execute(sql.format(marks=marks), tuple(names)).fetchall()
        out: dict[str, list[tuple[Any, ...]]] = {n: [] for n in names}
        for r in rows:
            out[r[0]].append(tuple(r[1:]))
        return out

    def records(self, rows: Sequence[JobRow]) -> list[JobRecord]:
        """:meth:`record` of many jobs, in three queries."""
        names = [r.name for r in rows]
        reports = self._grouped(
            "SELECT name, step, loss, batch, grad_sqr, grad_var FROM reports "
            "WHERE name IN ({marks}) ORDER BY rowid",
            names,
        )
        speeds = self._grouped(
            "SELECT name, workers, nodes, batch, steps_per_s FROM speeds WHERE name IN ({marks})",
            names,
        )
        ckpts = self._grouped(
            "SELECT name, step, path FROM checkpoints WHERE name IN ({marks}) ORDER BY step DESC",
            names,
        )
        return [_record(row, reports[row.name], speeds[row.name], ckpts[row.name]) for row in rows]

    def set_remaining(self, remaining: Mapping[str, float]) -> None:
        """Record the scheduler's remaining-steps estimates (one transaction)."""
        with self._tx() as db:
            db.executemany(
                "UPDATE jobs SET remaining = ? WHERE name = ?",
                [(float(v), k) for k, v in remaining.items()],
            )


def _record(
    row: JobRow,
    reports: list[tuple[Any, ...]],
    speeds: list[tuple[Any, ...]],
    ckpts: list[tuple[Any, ...]],
) -> JobRecord:
    """One job's :class:`JobRecord` from its rows of ``reports``, ``speeds``, ``checkpoints``."""
    points = [(int(r[0]), float(r[1])) for r in reports]
    ckpt = next(((int(st), p) for st, p in ckpts if Path(p).is_file()), None)
    done = ckpt[0] if ckpt is not None and row.state == "queued" else None
    if done is None:
        done = points[-1][0] if points else 0
    throughput: dict[tuple[float, ...], tuple[float, ...]] = {}
    for w, n, b, sp in speeds:
        key = (int(w), 0, int(n), float(b))
        throughput[key] = (*throughput.get(key, ()), float(sp))
    ab = row.spec.adaptive_batch
    goodput: dict[str, Any] = {}
    if ab is not None:
        by_step, stats = progress_by_step(
            ((r[0], r[2] if r[2] is not None else row.batch, r[3], r[4]) for r in reports),
            ab.init_batch,
        )
        reached = [v for s, v in by_step.items() if s <= done]  # in step order
        goodput = {
            "grad_stats": stats,
            "progress": reached[-1] if reached else 0.0,
            "progress_points": bucket_loss_points([(by_step[s], v) for s, v in points]),
        }
    return JobRecord(
        spec=row.spec,
        arrival=row.submitted,
        iterations_done=float(done),
        loss_points=bucket_loss_points(points),
        throughput=throughput,
        restarts=row.restarts,
        placement=row.placement,
        batch_size=row.batch,
        **goodput,
    )


def _work_rate(store: JobStore, row: JobRow) -> float | None:
    """The job's latest speed in the units of its remaining work: steps/s, or progress/s
    for a goodput job (steps/s times its mean progress per step)."""
    speed = store.last_speed(row.name)
    if speed is None or row.spec.adaptive_batch is None:
        return speed
    rec = store.record(row)
    return speed * rec.progress / rec.iterations_done if rec.iterations_done else speed


def status_lines(store: JobStore) -> list[str]:
    """The ``status`` table: job, state, workers, batch, step, loss, restarts, remaining
    work (steps; progress units for a goodput job), ETA."""
    rows = store.jobs()
    head = (
        f"{'job':<16} {'state':<10} {'workers':>7} {'batch':>6} {'step':>7} {'loss':>9} "
        f"{'restarts':>8} {'left':>7} {'ETA':>8}"
    )
    lines = [head]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
        last = store.last_report(r.name)
        step, loss = last if last is not None else (0, float("nan"))
        workers = r.placement.workers if r.placement is not None else 0
        left = r.remaining
        eta = "-"
        # the work rate reads the job's whole history: only for a running job's ETA
        speed = _work_rate(store, r) if left is not None and r.state == "running" else None
        if speed and left is not None:
            eta = time.strftime("%H:%M:%S", time.localtime(time.time() + left / speed))
        shown = "-" if left is None or r.state not in ACTIVE_STATES else f"{left:.0f}"
        lines.append(
            f"{r.name:<16} {r.state:<10} {workers:>7} {r.batch:>6} {step:>7} {loss:>9.4g} "
            f"{r.restarts:>8} {shown:>7} {eta:>8}"
        )
        if r.error:
            lines.append(f"  error: {r.error}")
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    lines.append(f"{len(rows)} job(s): {summary}" if rows else "no jobs")
    return lines
