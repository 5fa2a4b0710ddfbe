"""`dynsched simulate` end to end: the installed console script, defaults and a third-party policy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _dynsched() -> list[str]:
    exe = shutil.which("dynsched")
    return [exe] if exe else [sys.executable, "-m", "dynsched_core.cli"]


def test_simulate_with_no_arguments_predicts_the_published_experiment(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*_dynsched(), "simulate"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "dynsched-out"
    res = json.loads((out / "result.json").read_text())
    assert res["seeds"] == [0, 1, 2, 3, 4]  # the seed scenario's default
    mean = {a["configuration"]: a["wall_clock_s"]["mean"] for a in res["aggregate"]}
    # the static runs are what the two rates were fitted to; the dynamic run is predicted
    # (the published ordering is a statement of the document, not a fitted number)
    assert mean["static-16-16"] == pytest.approx(
        res["published_wall_clock_s"]["static-16-16"], rel=0.01
    )
    assert mean["static-8-24"] == pytest.approx(
        res["published_wall_clock_s"]["static-8-24"], rel=0.01
    )
    assert mean["dynamic-16-16"] < mean["static-8-24"] < mean["static-16-16"]
    assert "predicted" in proc.stdout and "residual" in proc.stdout
    for r in res["runs"]:
        assert {"configuration", "policy", "wall_clock_s", "lower_bound_s", "efficiency"} <= set(r)
        assert 0 < r["efficiency"] <= 1
    for png in ("queue_size.png", "utilization.png", "layout_dynamic-16-16_default.png"):
        assert (out / png).stat().st_size > 0
    assert "dynamic-16-16" in proc.stdout and "steps" in proc.stderr  # table and progress bars


def test_simulate_runs_a_third_party_policy(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *_dynsched(),
            "simulate",
            "--policy",
            "default",
            "example_threshold",
            "--steps",
            "8",
            "--no-plots",
            "--quiet",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "result.json").read_text())
    dynamic = [r["policy"] for r in res["runs"] if r["configuration"] == "dynamic-16-16"]
    assert list(dict.fromkeys(dynamic)) == ["default", "example_threshold"]
    assert len(dynamic) == 2 * len(res["seeds"])
