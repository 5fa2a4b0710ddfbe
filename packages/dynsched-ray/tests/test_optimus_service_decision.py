"""One scheduler code path: given the same observations, the Optimus service (its job table,
records and decision step) and the cluster simulator's host make the same decisions, round
after round (the policies keep state between rounds). No Ray: the service's start and
re-allocation are recorded instead of run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from dynsched_optimus import JobPlacement, OptimusError
from dynsched_optimus.cluster import make_scheduler
from dynsched_optimus.jobs import JobSpec
from dynsched_optimus.scheduler import AdaptiveBatch, CompletionRule, JobObservation
from dynsched_ray.optimus.service import OptimusService, ServiceOptions
from dynsched_ray.optimus.store import JobStore
from hypothesis import given, settings
from hypothesis import strategies as st

CAP = np.array([[4.0, 0.0], [4.0, 0.0], [2.0, 0.0]])
BATCH = 32


@st.composite
def _jobs(draw: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        req = draw(st.integers(1, 3))
        n = draw(st.integers(0, 12))
        a, c = draw(st.floats(0.5, 3.0)), draw(st.floats(0.0, 0.5))
        speeds = draw(
            st.dictionaries(st.integers(1, 4), st.floats(0.5, 20.0), min_size=0, max_size=3)
        )
        out.append(
            {
                "name": f"job{i}",
                "workers": req,
                "max_workers": req + draw(st.integers(0, 2)),
                "target": draw(st.one_of(st.just(None), st.floats(0.05, 0.5))),
                "losses": [(10 * (k + 1), a / (k + 1) + c) for k in range(n)],
                "speeds": speeds,
            }
        )
    return out


def _spec(job: dict[str, Any]) -> JobSpec:
    rule = (
        CompletionRule("steps", 400)
        if job["target"] is None
        else CompletionRule("target_metric", job["target"])
    )
    return JobSpec(job["name"], "x.py", BATCH, job["workers"], job["max_workers"], rule)


def _observation(
    job: dict[str, Any], arrival: float, placement: JobPlacement | None
) -> JobObservation:
    """The record the simulator's host is fed, built by hand from the same measurements."""
    spec = _spec(job)
    return JobObservation(
        job_id=job["name"],
        kind="allreduce",
        worker_demand=(1.0, 0.0),
        arrival=arrival,
        requested_workers=job["workers"],
        max_workers=job["max_workers"],
        iterations_done=job["losses"][-1][0] if job["losses"] else 0,
        throughput={(w, 0, 1, float(BATCH)): (s,) for w, s in job["speeds"].items()},
        loss_points=job["losses"],
        completion=spec.completion,
        placement=placement,
        batch_size=BATCH,
    )


class _Recorded(OptimusService):
    """The service with its Ray side replaced by a record of what it would do."""

    placed: dict[str, JobPlacement | None]

    def _capacity(self) -> tuple[np.ndarray, list[str | None]]:
        return CAP.copy(), [None] * len(CAP)

    def _start(self, row: Any, placement: JobPlacement, labels: list[str | None]) -> None:
        self.placed[row.name] = placement
        self.store.update(row.name, state="running", placement=placement)

    def _resize(self, row: Any, new: JobPlacement | None) -> None:
        self.placed[row.name] = new
        self.store.update(row.name, state="running" if new else "queued", placement=new)


@pytest.mark.parametrize("scheduler", ["optimus+", "optimus"])
@settings(deadline=None)
@given(jobs=_jobs())
def test_the_service_decides_like_the_simulator(
    tmp_path_factory: pytest.TempPathFactory, scheduler: str, jobs: list[dict[str, Any]]
) -> None:
    store = JobStore(tmp_path_factory.mktemp("db") / "jobs.sqlite")
    for i, job in enumerate(jobs):
        store.submit(_spec(job), now=100.0 + i)
        store.add_reports(
            job["name"],
            [{"t": 0.0, "step": s, "loss": v, "samples": BATCH} for s, v in job["losses"]],
        )
        for w, speed in job["speeds"].items():
            store.add_speed(job["name"], w, 1, BATCH, speed)
    service = _Recorded(
        store, ServiceOptions(scheduler=scheduler, restart_delay_s=7.0), clock=lambda: 500.0
    )
    host = make_scheduler(scheduler)  # the simulator's host of the same policy
    current: dict[str, JobPlacement | None] = {j["name"]: None for j in jobs}
    for _round in range(3):
        service.placed = {}
        service._schedule()
        obs = [_observation(j, 100.0 + i, current[j["name"]]) for i, j in enumerate(jobs)]
        want = host.policy.schedule(500.0, obs, CAP, restart_delay_s=7.0)  # type: ignore[attr-defined]
        for j in jobs:
            name = j["name"]
            expected = want.placements.get(name)
            got = service.placed.get(name)  # running jobs always pass through _resize
            assert (got is None) == (expected is None or expected.workers == 0), name
            if expected is not None and got is not None:
                assert (got.nodes, got.workers_per_node) == (
                    expected.nodes,
                    expected.workers_per_node,
                ), name
            row = next(r for r in store.jobs() if r.name == name)
            assert row.remaining == pytest.approx(want.remaining[name].estimate), name
            current[name] = expected if expected is not None and expected.workers else None
    store.close()


def test_the_recorded_service_reads_what_it_wrote(tmp_path: Path) -> None:
    """The store's record of a job is the measurements written (a check of the helper)."""
    store = JobStore(tmp_path / "jobs.sqlite")
    job = {
        "name": "a",
        "workers": 1,
        "max_workers": 2,
        "target": 0.1,
        "losses": [(10, 1.0), (20, 0.5)],
        "speeds": {1: 3.0},
    }
    store.submit(_spec(job), now=1.0)
    store.add_reports(
        "a", [{"t": 0.0, "step": s, "loss": v, "samples": BATCH} for s, v in job["losses"]]
    )
    store.add_speed("a", 1, 1, BATCH, 3.0)
    rec = store.record(store.jobs()[0])
    assert rec.loss_points == ((10.0, 1.0), (20.0, 0.5)) and rec.iterations_done == 20
    assert rec.throughput == {(1, 0, 1, float(BATCH)): (3.0,)}


# ------------------------------------------------------------------ goodput jobs

#: the adaptive jobs' range: initial batch 32 up to 512, 8 to 256 per worker
RANGE = AdaptiveBatch(float(BATCH), 512.0, min_local=8.0, max_local=256.0)


@st.composite
def _goodput_jobs(draw: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 40))
        a, c = draw(st.floats(0.5, 3.0)), draw(st.floats(0.0, 0.5))
        batch = draw(st.sampled_from([32, 64, 128]))
        stats = draw(st.one_of(st.none(), st.tuples(st.floats(0.1, 2.0), st.floats(0.0, 5e3))))
        out.append(
            {
                "name": f"g{i}",
                "workers": draw(st.integers(1, 3)),
                "target": draw(st.floats(0.05, 0.5)),
                "batch": batch,
                "stats": stats if n else None,
                # every step reported, at the job's batch, with the same statistics
                "losses": [(s, a / s + c) for s in range(1, n + 1)],
                "speeds": draw(
                    st.dictionaries(st.integers(1, 4), st.floats(0.5, 20.0), max_size=3)
                ),
            }
        )
    return out


def _goodput_spec(job: dict[str, Any]) -> JobSpec:
    rule = CompletionRule("target_metric", job["target"])
    return JobSpec(
        job["name"],
        "x.py",
        BATCH,
        job["workers"],
        0,
        rule,
        adaptive_batch=RANGE,
        batch_change="in_place",
    )


def _goodput_observation(
    job: dict[str, Any], arrival: float, placement: JobPlacement | None, batch: int
) -> JobObservation:
    """The simulator host's record of the job, by hand: progress is one efficiency gain
    per step (Pollux's formula at the job's batch), the variance taken at the initial
    batch."""
    sqr, var = job["stats"] if job["stats"] else (None, None)
    s = job["batch"] / BATCH
    gain = s if var is None else (var / BATCH + sqr) / (var / BATCH / s + sqr)
    progress, points = 0.0, []
    for _step, v in job["losses"]:  # progress accumulates step by step, as a simulated job's
        progress += gain
        points.append((progress, v))
    ab = attrs.evolve(
        RANGE,
        grad_sqr=sqr,
        grad_var=None if var is None else var / BATCH,
        progress=progress,
        progress_points=points,
    )
    spec = _goodput_spec(job)
    return JobObservation(
        job_id=job["name"],
        kind="allreduce",
        worker_demand=(1.0, 0.0),
        arrival=arrival,
        requested_workers=job["workers"],
        max_workers=spec.max_workers,
        iterations_done=len(job["losses"]),
        throughput={(w, 0, 1, float(job["batch"])): (v,) for w, v in job["speeds"].items()},
        loss_points=job["losses"],
        completion=spec.completion,
        placement=placement,
        batch_size=batch,
        adaptive_batch=ab,
    )


class _RecordedBatches(_Recorded):
    """Also records the batch each job is started or kept running with."""

    batches: dict[str, int]

    def _start(self, row: Any, placement: JobPlacement, labels: list[str | None]) -> None:
        super()._start(row, placement, labels)
        self.batches[row.name] = row.batch
        self.store.update(row.name, batch=row.batch)

    def _resize(self, row: Any, new: JobPlacement | None) -> None:
        super()._resize(row, new)
        self.batches[row.name] = row.batch
        self.store.update(row.name, batch=row.batch)


@settings(deadline=None)
@given(jobs=_goodput_jobs())
def test_the_service_chooses_goodput_batches_like_the_simulator(
    tmp_path_factory: pytest.TempPathFactory, jobs: list[dict[str, Any]]
) -> None:
    """Same placements and the same batches, round after round, for jobs that report
    gradient statistics (``optimus+`` with goodput batches)."""
    _same_goodput_decisions(tmp_path_factory.mktemp("db"), jobs)


def test_a_noisy_job_gets_a_larger_batch_from_both(tmp_path: Path) -> None:
    """The check above on a case where the batch does change (so it checks something)."""
    noisy = {
        "name": "g0",
        "workers": 2,
        "target": 0.05,
        "batch": 32,
        "stats": (0.5, 4000.0),  # noise scale 8000 examples
        "losses": [(s, 2.0 / s + 0.1) for s in range(1, 31)],
        "speeds": {2: 10.0},
    }
    assert _same_goodput_decisions(tmp_path, [noisy]) >= 1


def _same_goodput_decisions(folder: Path, jobs: list[dict[str, Any]]) -> int:
    """Three rounds of the service and the simulator's host on the same measurements;
    returns how many batch changes they agreed on."""
    store = JobStore(folder / "jobs.sqlite")
    for i, job in enumerate(jobs):
        store.submit(_goodput_spec(job), now=100.0 + i)
        store.update(job["name"], batch=job["batch"])
        sqr, var = job["stats"] if job["stats"] else (None, None)
        store.add_reports(
            job["name"],
            [
                {
                    "t": 0.0,
                    "step": s,
                    "loss": v,
                    "samples": job["batch"],
                    "grad_sqr": sqr,
                    "grad_var": var,
                }
                for s, v in job["losses"]
            ],
        )
        for w, speed in job["speeds"].items():
            store.add_speed(job["name"], w, 1, job["batch"], speed)
    service = _RecordedBatches(
        store, ServiceOptions(scheduler="optimus+", restart_delay_s=7.0), clock=lambda: 500.0
    )
    host = make_scheduler("optimus+")
    current: dict[str, JobPlacement | None] = {j["name"]: None for j in jobs}
    batch = {j["name"]: j["batch"] for j in jobs}
    changed = 0
    for _round in range(3):
        service.placed, service.batches = {}, {}
        service._schedule()
        obs = [
            _goodput_observation(j, 100.0 + i, current[j["name"]], batch[j["name"]])
            for i, j in enumerate(jobs)
        ]
        want = host.policy.schedule(500.0, obs, CAP, restart_delay_s=7.0)  # type: ignore[attr-defined]
        for j in jobs:
            name = j["name"]
            expected = want.placements.get(name)
            got = service.placed.get(name)
            assert (got is None) == (expected is None or expected.workers == 0), name
            if expected is not None and got is not None:
                assert (got.nodes, got.workers_per_node) == (
                    expected.nodes,
                    expected.workers_per_node,
                ), name
                assert service.batches[name] == want.batch_sizes.get(name, batch[name]), name
                changed += name in want.batch_sizes
                batch[name] = service.batches[name]
            current[name] = expected if expected is not None and expected.workers else None
    store.close()
    return changed


def test_the_store_keeps_batches_statistics_and_progress(tmp_path: Path) -> None:
    """A goodput job's record: its current batch, its smoothed statistics and a progress
    that counts the steps up to the checkpoint it will resume from."""
    store = JobStore(tmp_path / "jobs.sqlite")
    job = {"name": "g", "workers": 1, "target": 0.1, "batch": 64}
    store.submit(_goodput_spec(job), now=1.0)
    assert store.jobs()[0].batch == BATCH  # the spec's until the service changes it
    ckpt = tmp_path / "step-4.ckpt"
    ckpt.write_bytes(b"x")
    store.add_checkpoint("g", 4, str(ckpt), 0.0)
    store.add_reports(
        "g",
        [
            {"t": 0.0, "step": s, "loss": 1.0 / s, "samples": 64, "batch": 64}
            | ({"grad_sqr": 1.0, "grad_var": 3.0 * BATCH} if s > 2 else {})
            for s in range(1, 7)
        ],
    )
    store.update("g", batch=64, state="queued")
    store.add_batch_change("g", 0, BATCH, 64, "start")
    rec = store.record(store.jobs()[0])
    assert rec.batch_size == 64 and rec.grad_stats == (1.0, 3.0 * BATCH)
    gain = (3.0 + 1.0) / (3.0 / 2 + 1.0)  # batch 64 = 2x the initial, noise 3 x 32
    assert rec.iterations_done == 4 and rec.progress == pytest.approx(2 * 2.0 + 2 * gain)
    assert [p for p, _ in rec.progress_points][-1] == pytest.approx(4.0 + 4 * gain)
    assert store.batch_changes("g") == [(0, BATCH, 64, "start")]
    assert [n for _, n in store.samples("g")] == [64] * 6
    with pytest.raises(OptimusError, match=r"how='later': allowed values are \['in_place'"):
        store.add_batch_change("g", 0, 1, 2, "later")
    store.close()


def test_a_table_of_the_first_release_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE jobs (name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL,
            submitted REAL NOT NULL, started REAL, ended REAL, error TEXT,
            restarts INTEGER NOT NULL DEFAULT 0, cancel INTEGER NOT NULL DEFAULT 0,
            placement TEXT, remaining REAL);
        CREATE TABLE reports (name TEXT NOT NULL, t REAL NOT NULL, step INTEGER NOT NULL,
            loss REAL NOT NULL, samples INTEGER NOT NULL);
        """
    )
    spec = _spec({"name": "old", "workers": 1, "max_workers": 1, "target": 0.1})
    old = {k: v for k, v in spec.to_dict().items() if k != "batch_change"}
    db.execute(
        "INSERT INTO jobs (name, spec, state, submitted) VALUES ('old', ?, 'queued', 1.0)",
        (json.dumps(old),),
    )
    db.execute("INSERT INTO reports VALUES ('old', 0.0, 1, 0.5, 32)")
    db.commit()
    db.close()
    store = JobStore(path)
    [row] = store.jobs()
    assert row.batch == BATCH and row.spec == spec
    store.add_reports("old", [{"t": 0.0, "step": 2, "loss": 0.4, "samples": 32}])
    assert store.record(row).loss_points == ((1.0, 0.5), (2.0, 0.4))
    store.close()
