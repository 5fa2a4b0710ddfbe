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


def test_simulate_with_no_arguments_reproduces_the_published_ordering(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*_dynsched(), "simulate"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "dynsched-out"
    res = json.loads((out / "result.json").read_text())
    wall = {r["configuration"]: r["wall_clock_s"] for r in res["runs"]}
    assert wall["dynamic-16-16"] < wall["static-8-24"] < wall["static-16-16"]
    assert wall["static-16-16"] / wall["dynamic-16-16"] == pytest.approx(1.21, abs=0.03)
    assert wall["static-8-24"] / wall["dynamic-16-16"] == pytest.approx(1.18, abs=0.03)
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
    assert [r["policy"] for r in res["runs"] if r["configuration"] == "dynamic-16-16"] == [
        "default",
        "example_threshold",
    ]
