"""``dynsched simulate``: table, result.json, plots, determinism, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dynsched_core.cli import main as dynsched_main
from dynsched_sim import load_scenario
from dynsched_sim.calibrate import scenario_to_dict
from dynsched_sim.cli import main


@pytest.fixture()
def short_scenario(tmp_path: Path) -> Path:
    d = scenario_to_dict(load_scenario("seed-qwen35").with_steps(8))
    p = tmp_path / "short.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_simulate_through_the_dispatcher(
    short_scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    rc = dynsched_main(
        ["simulate", "--scenario", str(short_scenario), "--out", str(out), "--quiet"]
    )
    assert rc in (0, None)
    text = capsys.readouterr().out
    for word in (
        "static-16-16",
        "static-8-24",
        "dynamic-16-16",
        "effic.",
        "switches",
        "aborted",
        "re-routed",
    ):
        assert word in text
    res = json.loads((out / "result.json").read_text())
    assert [(r["configuration"], r["policy"]) for r in res["runs"]] == [
        ("static-16-16", "static_fully_async"),
        ("static-8-24", "static_fully_async"),
        ("dynamic-16-16", "default"),
    ]
    for r in res["runs"]:
        assert r["wall_clock_s"] > 0 and r["lower_bound_s"] > 0
        assert r["efficiency"] == pytest.approx(r["lower_bound_s"] / r["wall_clock_s"])
        assert set(r["speedup_vs"]) == {"static-16-16", "static-8-24"}
        assert "dynamic_resource/resource_utilization" in r["proxy_metrics"]
    for name in (
        "queue_size.png",
        "utilization.png",
        "layout_dynamic-16-16_default.png",
        "table.txt",
    ):
        assert (out / name).stat().st_size > 0


def test_same_seed_gives_identical_result_json(short_scenario: Path, tmp_path: Path) -> None:
    args = ["--scenario", str(short_scenario), "--no-plots", "--quiet", "--seed", "7"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "result.json").read_bytes() == (
        tmp_path / "b" / "result.json"
    ).read_bytes()


def test_several_policies_and_steps_override(short_scenario: Path, tmp_path: Path) -> None:
    rc = main(
        [
            "--scenario",
            str(short_scenario),
            "--policy",
            "default",
            "fixed_ratio",
            "--steps",
            "4",
            "--no-plots",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    res = json.loads((tmp_path / "result.json").read_text())
    assert [r["policy"] for r in res["runs"]] == [
        "static_fully_async",
        "static_fully_async",
        "default",
        "fixed_ratio",
    ]
    assert all(r["summary"]["steps"] == 4 for r in res["runs"])


def test_errors_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policy", "defualt", "--out", str(tmp_path)]) == 2
    assert "default" in capsys.readouterr().err
    assert main(["--scenario", "nope", "--out", str(tmp_path)]) == 2
    assert "seed-qwen35" in capsys.readouterr().err


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "seed-qwen35" in out and "fixed_ratio" in out
