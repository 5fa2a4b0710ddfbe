"""``benchmarks/optimus_incremental_scale.py`` runs end to end on a small size, writes every
case of every variant with the allocations it timed, and refuses a bad ``--repeat``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def test_small_run_writes_every_case(
    load_benchmark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("optimus_incremental_scale")
    out = tmp_path / "scale.json"
    assert bench.main(["--jobs", "20", "--repeat", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} == {"optimus+", "optimus+rw"}
    for r in rows:
        for case in (
            "empty",
            "steady",
            "placed",
            "placed_empty",
            "steady_history",
            "placed_history",
        ):
            assert r[f"{case}_cpu_s"] >= 0.0
        assert r["tasks_empty"] > 0 and r["tasks_steady"] > 0
        assert r["tasks_placed"] <= r["tasks_steady"]  # placing can only cut tasks
    printed = capsys.readouterr().out
    assert "placed from empty" in printed and "placed with restart histories" in printed


def test_bad_repeat_is_one_clear_error(
    load_benchmark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("optimus_incremental_scale")
    with pytest.raises(SystemExit) as e:
        bench.main(["--repeat", "0"])
    assert e.value.code == 2
    assert "--repeat must be >= 1, got 0" in capsys.readouterr().err
