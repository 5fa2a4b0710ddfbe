"""``benchmarks/optimus_pollux_baseline.py``'s per-job "why" record and table: hand-computed
time-weighted means, a job's detail from a simulation result, and the per-workload counts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


def test_time_weighted_mean_by_hand(load_benchmark: Any) -> None:
    bench = load_benchmark("optimus_pollux_baseline")
    # 0 GPUs from 0, 4 from 10, 2 from 30: over [10, 40] (4 for 20 s, 2 for 10 s) = 10/3
    steps = [(0.0, 0.0), (10.0, 4.0), (30.0, 2.0)]
    assert bench._time_mean(steps, 10.0, 40.0) == pytest.approx(10.0 / 3.0)
    assert bench._time_mean(steps, 0.0, 20.0) == pytest.approx(2.0)  # 0 for 10 s, 4 for 10 s
    assert bench._time_mean(steps, 35.0, 35.0) == 2.0  # an empty span: the value there
    assert bench._time_mean([(5.0, 3.0)], 0.0, 10.0) == 3.0  # the first value also before it
    assert bench._time_mean([], 0.0, 10.0) == 0.0


def test_job_detail_from_a_result(load_benchmark: Any) -> None:
    bench = load_benchmark("optimus_pollux_baseline")
    # submitted at 100 with batch 64, first GPUs (2) at 160, 4 from 260, done at 460 (JCT
    # 360): 2 for 100 s and 4 for 200 s -> 10/3; batch 64 until 260, 128 after -> 320/3
    res = SimpleNamespace(
        jct={"j": 360.0},
        allocations={"j": [(160.0, 2, 0), (260.0, 4, 0)]},
        batches={"j": [(100.0, 64), (260.0, 128)]},
        restarts={"j": 1},
    )
    got = bench.job_detail(res, {"j": (100.0, 64.0)})["j"]
    assert got == {
        "queue_s": 60.0,
        "gpus": pytest.approx(3.33, abs=0.01),
        "batch": 106.7,
        "restarts": 1,
    }


def _row(sched: str, jct: dict[str, float], detail: dict[str, dict[str, float]]) -> dict:
    return {
        "load": "1.0",
        "workload": "workload-1",
        "scheduler": sched,
        "seed": 0,
        "search": "100x100" if sched == "pollux" else "-",
        "jct": jct,
        "job_detail": detail,
    }


def test_why_table_counts_the_losses_and_their_causes(load_benchmark: Any, tmp_path: Path) -> None:
    bench = load_benchmark("optimus_pollux_baseline")

    def d(q: float, g: float, b: float, r: int) -> dict[str, float]:
        return {"queue_s": q, "gpus": g, "batch": b, "restarts": r}

    ours = _row(
        "optimus+rw",
        {"a": 200.0, "b": 100.0, "c": 50.0},
        {"a": d(5, 1.0, 32, 3), "b": d(5, 4.0, 64, 0), "c": d(0, 8.0, 128, 0)},
    )
    theirs = _row(
        "pollux",
        {"a": 100.0, "b": 100.5, "c": 80.0},
        {"a": d(5, 2.0, 64, 1), "b": d(5, 4.0, 64, 0), "c": d(0, 4.0, 64, 1)},
    )
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [ours, theirs]}))
    text = bench.why_table([str(path)], ("optimus+rw", "pollux"))
    # "a" is lost (fewer GPUs, smaller batch, more restarts); "b" is within 1 %: not lost
    assert (
        "workload-1: optimus+rw loses 1 of 3 jobs (JCT over 1 % longer); of those, 0 waited "
        "longer for a GPU, 1 ran on fewer GPUs, 1 with a smaller batch, 1 restarted more often"
    ) in text
    assert "| a | 200 / 100 | 5 / 5 | 1.0 / 2.0 | 32 / 64 | 3.0 / 1 |" in text
    assert text.count("| a |") == 1  # a workload of three jobs lists each once
    assert (
        "all workloads: optimus+rw loses 1 of 3 jobs; of those, 0 waited longer for a GPU, "
        "1 ran on fewer GPUs, 1 with a smaller batch, 1 restarted more often"
    ) in text
    # another load: nothing recorded there, no table
    assert "all workloads" not in bench.why_table([str(path)], ("optimus+rw", "pollux"), "0.5")
