"""The service's throughput samples: one per MIN_SPEED_REPORTS steady step times, gathered
over one poll or several (slow steps give fewer reports per poll), never from a run's
first step. No Ray: the worker group is a stand-in holding what the service reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import MIN_SPEED_REPORTS, JobSpec
from dynsched_ray.optimus.service import OptimusService, ServiceOptions
from dynsched_ray.optimus.store import JobStore
from hypothesis import given, settings
from hypothesis import strategies as st


class _Group:
    """What ``OptimusService._speed`` reads of a worker group."""

    def __init__(self, spec: JobSpec, first_step: int) -> None:
        self.spec = spec
        self.placement = JobPlacement(spec.name, (0,), (0,), (2,))
        self.first_step = first_step
        self.steady_dt: list[float] = []


def _reports(steps: range, dt: float) -> list[dict[str, Any]]:
    return [{"kind": "report", "step": s, "dt": dt, "loss": 1.0, "samples": 8} for s in steps]


@settings(deadline=None, max_examples=20)
@given(
    per_poll=st.lists(st.integers(0, 7), min_size=1, max_size=12),
    first_step=st.integers(0, 50),
)
def test_samples_gather_over_polls(
    tmp_path_factory: pytest.TempPathFactory, per_poll: list[int], first_step: int
) -> None:
    store = JobStore(tmp_path_factory.mktemp("db") / "jobs.sqlite")
    spec = JobSpec("a", "x.py", 8, workers=2, max_workers=2)
    store.submit(spec, now=0.0)
    service = OptimusService(store, ServiceOptions(scheduler="fifo"))
    group = _Group(spec, first_step)
    step, pending, samples = first_step + 1, 0, 0
    for k, n in enumerate(per_poll):
        dt = 0.1 * (k + 1)
        service._speed(group, _reports(range(step, step + n), dt))  # type: ignore[arg-type]
        steady = sum(1 for s in range(step, step + n) if s > first_step + 1)
        step += n
        pending += steady
        if pending >= MIN_SPEED_REPORTS:
            samples, pending = samples + 1, 0
    got = store.records(store.jobs())[0].throughput.get((2, 0, 1, 8.0), ())
    assert len(got) == samples
    assert len(group.steady_dt) == pending
    store.close()


def test_a_sample_is_the_mean_speed_of_its_steps(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    spec = JobSpec("a", "x.py", 8, workers=2, max_workers=2)
    store.submit(spec, now=0.0)
    service = OptimusService(store, ServiceOptions(scheduler="fifo"))
    group = _Group(spec, 0)
    service._speed(group, _reports(range(1, 4), 0.5))  # type: ignore[arg-type]  # steps 2, 3 steady
    service._speed(group, _reports(range(4, 7), 0.25))  # type: ignore[arg-type]
    (speed,) = store.records(store.jobs())[0].throughput[(2, 0, 1, 8.0)]
    assert speed == pytest.approx(5 / (2 * 0.5 + 3 * 0.25))
    assert store.speeds("a") == [(2, 1, 8.0, speed)]
    store.close()
