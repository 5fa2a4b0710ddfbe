"""``plot_results``: which files it writes and what each figure holds."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
from dynsched_optimus.cluster import SimResult
from dynsched_optimus.cluster._report import plot_results
from matplotlib.figure import Figure

matplotlib.use("Agg")


def _result(name: str, *, batches: bool) -> SimResult:
    return SimResult(
        scheduler=name,
        jct={"a": 100.0, "b": 400.0},
        makespan=7200.0,
        gpu_utilization=0.5,
        task_utilization=0.5,
        overhead_share=0.0,
        restarts={"a": 0, "b": 1},
        timeline=[(0.0, 1, 1, 2), (3600.0, 2, 0, 4)],
        allocations={"a": [(0.0, 2, 1)], "b": [(0.0, 1, 0), (3600.0, 3, 1), (5400.0, 0, 0)]},
        prediction_errors=[],
        wall_s=0.0,
        simulated_s=7200.0,
        batches={"b": [(0.0, 64), (3600.0, 256)]} if batches else {},
    )


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """The figures ``plot_results`` saves, by file name."""
    saved: dict[str, Figure] = {}
    original = Figure.savefig

    def record(self: Figure, fname: Path, *args: object, **kwargs: object) -> None:
        saved[Path(fname).name] = self
        original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return saved


def test_no_results_writes_no_allocation_plot(tmp_path: Path, figures: dict[str, Figure]) -> None:
    with pytest.warns(UserWarning, match="No artists"):
        paths = plot_results([], tmp_path, job="b")
    assert [p.name for p in paths] == ["jct_cdf.png", "running_jobs.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_default_job_is_the_most_changed_one(tmp_path: Path, figures: dict[str, Figure]) -> None:
    paths = plot_results([_result("x", batches=False)], tmp_path, title="t")
    assert [p.name for p in paths] == ["jct_cdf.png", "running_jobs.png", "allocation_job.png"]
    cdf = figures["jct_cdf.png"].axes[0]
    assert (cdf.get_xscale(), cdf.get_title()) == ("log", "JCT CDF t")
    assert list(cdf.get_lines()[0].get_ydata()) == [0.5, 1.0]
    (ax,) = figures["allocation_job.png"].axes
    assert ax.get_title() == "Allocation of b"
    assert ax.get_xlabel() == "time (h)"
    line = ax.get_lines()[0]
    assert list(line.get_xdata()) == [0.0, 1.0, 1.5, 2.0]
    assert list(line.get_ydata()) == [1, 4, 0, 0]


def test_batch_panel_under_the_allocation(tmp_path: Path, figures: dict[str, Figure]) -> None:
    results = [_result("plain", batches=False), _result("goodput", batches=True)]
    plot_results(results, tmp_path, job="b")
    top, bottom = figures["allocation_job.png"].axes
    assert top.get_xlabel() == "" and bottom.get_xlabel() == "time (h)"
    assert bottom.get_yscale() == "log"
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["goodput"]
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["plain", "goodput"]
    (batch,) = bottom.get_lines()
    assert list(batch.get_ydata()) == [64, 256, 256]
    assert batch.get_color() == top.get_lines()[1].get_color() == "C1"
