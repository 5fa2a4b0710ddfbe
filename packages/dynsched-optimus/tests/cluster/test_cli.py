"""CLI sub-commands and plots on a tiny workload."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from dynsched_optimus.cluster import cli

_TINY = """name,time,application,num_replicas,batch_size
ncf-0,0,ncf,1,32768
cifar10-1,30,cifar10,6,2048
ncf-2,200,ncf,1,32768
bert-3,300,bert,6,384
"""


@pytest.fixture
def tiny(tmp_path: Path, pollux_root: Path) -> Path:
    p = tmp_path / "tiny.csv"
    p.write_text(_TINY)
    return p


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    cli.add_subcommands(sub)
    return parser


def test_simulate_writes_table_json_and_plots(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = _parser().parse_args(
        ["simulate", "--workload", str(tiny), "--scheduler", "optimus", "--out", str(out)]
    )
    assert args.func(args) == 0
    text = capsys.readouterr()
    assert "avg_jct_s" in text.out
    assert "done" in text.err  # progress output
    data = json.loads((out / "optimus.json").read_text())
    assert set(data["jct"]) == {"ncf-0", "cifar10-1", "ncf-2", "bert-3"}
    for name in ("jct_cdf.png", "running_jobs.png", "allocation_job.png"):
        assert (out / name).stat().st_size > 0


def test_compare_table_and_summary(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    args = _parser().parse_args(
        [
            "compare",
            "--workloads",
            str(tiny),
            "--schedulers",
            "fifo,tiresias,optimus+",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert re.search(r"\| tiny \| optimus\+ \| 4 \|", text)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["mean"]) == {"fifo", "tiresias", "optimus+"}


def test_compare_rejects_unknown_scheduler(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["compare", "--schedulers", "fifo,nope", "--quiet"])
    assert args.func(args) == 2
    assert "unknown scheduler" in capsys.readouterr().err


def test_simulate_missing_workload_is_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["simulate", "--workload", "/nonexistent/w.csv", "--quiet"])
    assert args.func(args) == 2
    assert "missing file" in capsys.readouterr().err


def test_simulate_ps_workload(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(
        ["simulate", "--ps", "--num-jobs", "4", "--scheduler", "drf", "--quiet"]
    )
    assert args.func(args) == 0
    assert "drf" in capsys.readouterr().out
