"""Tables, JSON and plots of simulation results."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._sim import SimResult

__all__ = ["format_table", "plot_results", "result_to_dict", "write_result"]


def result_to_dict(result: SimResult) -> dict[str, object]:
    """JSON-serialisable form of a result (summary, per-job JCT, timelines)."""
    return {
        "summary": {
            k: (float(v) if isinstance(v, (np.floating, float)) else v)
            for k, v in result.summary().items()
        },
        "jct": {k: float(v) for k, v in result.jct.items()},
        "restarts": result.restarts,
        "unfinished": list(result.unfinished),
        "timeline": [list(map(float, t)) for t in result.timeline],
        "allocations": {k: [list(map(float, a)) for a in v] for k, v in result.allocations.items()},
        "prediction_errors": [list(map(float, e)) for e in result.prediction_errors],
        "batches": {k: [[float(t), int(b)] for t, b in v] for k, v in result.batches.items()},
    }


def write_result(result: SimResult, path: Path) -> None:
    """Write :func:`result_to_dict` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result_to_dict(result), indent=1))


def format_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """A plain-text (Markdown) table."""
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, sep]
    digits = {c: _decimals([r.get(c) for r in rows]) for c in columns}
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c, "")
            if isinstance(v, float):
                cells.append("-" if not math.isfinite(v) else f"{v:,.{digits[c]}f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _decimals(values: Sequence[object]) -> int:
    """Decimals of a float column: one fixed format per column, never scientific."""
    floats = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v)]
    if not floats:
        return 0
    top = max(floats)
    return 0 if top >= 100 else 2 if top >= 1 else 3


def plot_results(
    results: Sequence[SimResult], out_dir: Path, *, job: str | None = None, title: str = ""
) -> list[Path]:
    """JCT CDF, running jobs over time and one job's allocation over time (PNG files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        v = np.sort(np.array(list(r.jct.values())))
        if len(v):
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=r.scheduler)
    ax.set_xscale("log")
    _label(ax, "JCT (s)", "CDF", f"JCT CDF {title}")
    paths = [_save(plt, fig, out_dir / "jct_cdf.png")]

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        t = np.array([x[0] for x in r.timeline]) / 3600
        ax.plot(t, [x[1] for x in r.timeline], label=r.scheduler, lw=0.8)
    _label(ax, "time (h)", "running jobs", f"Running jobs {title}")
    paths.append(_save(plt, fig, out_dir / "running_jobs.png"))

    job = _plotted_job(results, job)
    if job is not None:
        fig = _allocation_figure(plt, results, job)
        paths.append(_save(plt, fig, out_dir / "allocation_job.png"))
    return paths


def _label(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plotted_job(results: Sequence[SimResult], job: str | None) -> str | None:
    """``job``, or the job with the most allocation changes under the first scheduler."""
    if not results:
        return None
    if job is not None:
        return job
    allocs = results[0].allocations
    return max(sorted(allocs), key=lambda k: len(allocs[k])) if allocs else None


def _allocation_figure(plt: Any, results: Sequence[SimResult], job: str) -> Any:
    """Tasks of ``job`` over time, above its global batch when a scheduler changed it."""
    with_batch = [r for r in results if r.batches.get(job)]
    color = {id(r): f"C{i}" for i, r in enumerate(results)}
    if with_batch:
        fig, (ax, bx) = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
        for r in with_batch:
            b = r.batches[job]
            t = [x[0] / 3600 for x in b] + [r.makespan / 3600]
            y = [x[1] for x in b] + [b[-1][1]]
            bx.step(t, y, where="post", label=r.scheduler, color=color[id(r)])
        bx.set_yscale("log")
        bx.set_xlabel("time (h)")
        bx.set_ylabel("global batch size")
        bx.legend()
    else:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.set_xlabel("time (h)")
    for r in results:
        a = r.allocations.get(job, [])
        if not a:
            continue
        t = [x[0] / 3600 for x in a] + [r.makespan / 3600]
        w = [x[1] + x[2] for x in a] + [a[-1][1] + a[-1][2]]
        ax.step(t, w, where="post", label=r.scheduler, color=color[id(r)])
    ax.set_ylabel("tasks (workers + PS)")
    ax.set_title(f"Allocation of {job}")
    ax.legend()
    return fig
