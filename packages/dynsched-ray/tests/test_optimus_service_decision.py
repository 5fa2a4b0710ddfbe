"""One scheduler code path: given the same observations, the Optimus service (its job table,
records and decision step) and the cluster simulator's host make the same decisions, round
after round (the policies keep state between rounds). No Ray: the service's start and
re-allocation are recorded instead of run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dynsched_optimus import JobPlacement
from dynsched_optimus.cluster import make_scheduler
from dynsched_optimus.jobs import JobSpec
from dynsched_optimus.scheduler import CompletionRule, JobObservation
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
