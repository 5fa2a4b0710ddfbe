"""Throughput samples do not depend on how the polls slice the reports: a slow machine that
delivers one report per poll gives the same samples as a fast one that delivers ten. No Ray:
the service's speed bookkeeping is driven with a group record and a real job table."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from dynsched_optimus import JobPlacement
from dynsched_optimus.jobs import JobSpec
from dynsched_ray.optimus.service import MIN_SPEED_REPORTS, OptimusService, ServiceOptions
from dynsched_ray.optimus.store import JobStore
from hypothesis import given, settings
from hypothesis import strategies as st


def _reports(first: int, dts: list[float]) -> list[dict[str, float]]:
    return [{"kind": "report", "step": first + 1 + i, "dt": dt} for i, dt in enumerate(dts)]


@settings(deadline=None)
@given(
    dts=st.lists(st.floats(0.01, 2.0), min_size=0, max_size=23),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    first=st.integers(0, 40),
)
def test_speed_samples_are_the_same_however_the_polls_cut_the_reports(
    tmp_path_factory: pytest.TempPathFactory, dts: list[float], cuts: list[int], first: int
) -> None:
    store = JobStore(Path(tmp_path_factory.mktemp("speed")) / "jobs.sqlite")
    spec = JobSpec("j", "x.py", 16, 2, 2)
    store.submit(spec, now=0.0)
    service = OptimusService(store, ServiceOptions(), on_line=lambda _: None)
    group = SimpleNamespace(
        spec=spec,
        placement=JobPlacement("j", (0,), (0,), (2,)),
        first_step=first,
        batch=16,
        step_times={},
    )
    # the run's first report (start-up) never counts; then the steady ones, sliced by `cuts`
    reports = [{"kind": "report", "step": first + 1, "dt": 99.0}, *_reports(first + 1, dts)]
    i = 0
    for n in [*cuts, len(reports)]:
        service._speed(group, reports[i : i + n])  # type: ignore[arg-type]
        i += n
    rec = store.record(next(r for r in store.jobs() if r.name == "j"))
    samples = list(rec.throughput.get((2, 0, 1, 16.0), ()))
    whole = len(dts) // MIN_SPEED_REPORTS
    expected = [
        MIN_SPEED_REPORTS / sum(dts[k * MIN_SPEED_REPORTS : (k + 1) * MIN_SPEED_REPORTS])
        for k in range(whole)
    ]
    assert samples == pytest.approx(expected)
    assert len(group.step_times.get(16, [])) == len(dts) - whole * MIN_SPEED_REPORTS
    store.close()


def test_one_job_row_is_read_by_name(tmp_path: Path) -> None:
    """`JobStore.job` (what the service reads per job per poll) is the row `jobs()` lists."""
    store = JobStore(tmp_path / "jobs.sqlite")
    for i, name in enumerate(("a", "b", "c")):
        store.submit(JobSpec(name, "x.py", 8 * (i + 1)), now=float(i))
    store.update("b", state="running", restarts=2)
    assert [store.job(r.name) for r in store.jobs()] == store.jobs()
    assert store.job("b").restarts == 2 and store.job("b").spec.batch_size == 16
    with pytest.raises(KeyError, match="no job 'd'"):
        store.job("d")
    store.close()
