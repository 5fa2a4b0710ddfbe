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
    d["seeds"] = 1
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
    # the compact default view: fits 100 columns, explains its columns
    for word in ("static-16-16", "static-8-24", "dynamic-16-16", "eff", "util", "switches"):
        assert word in text
    assert "wall h: simulated wall-clock (hours)" in text and "--full" in text
    assert max(len(line) for line in text.splitlines() if not line.startswith("wrote ")) <= 100
    # the full view: in table.txt (and with --full)
    full = (out / "table.txt").read_text()
    for word in ("effic.", "switches", "aborted", "re-routed", "proxy/true"):
        assert word in full
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


def test_seeds_report_mean_and_spread(
    short_scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--scenario", str(short_scenario), "--no-plots", "--quiet", "--out", str(tmp_path)]
    assert main([*args, "--seeds", "3", "--seed", "4"]) == 0
    text = capsys.readouterr().out
    assert "over 3 workload seeds (4..6)" in text and "±" in text
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["seeds"] == [4, 5, 6]
    assert len(res["runs"]) == 9 and {r["seed"] for r in res["runs"]} == {4, 5, 6}
    agg = {a["configuration"]: a for a in res["aggregate"]}
    dyn = agg["dynamic-16-16"]
    assert dyn["seeds"] == [4, 5, 6] and dyn["wall_clock_s"]["n"] == 3
    walls = [r["wall_clock_s"] for r in res["runs"] if r["configuration"] == "dynamic-16-16"]
    assert dyn["wall_clock_s"]["mean"] == pytest.approx(sum(walls) / 3)
    # paired speed-ups: per seed, static over dynamic on the same workload
    static = {
        r["seed"]: r["wall_clock_s"] for r in res["runs"] if r["configuration"] == "static-16-16"
    }
    dyn_runs = [r for r in res["runs"] if r["configuration"] == "dynamic-16-16"]
    ratios = [static[r["seed"]] / r["wall_clock_s"] for r in dyn_runs]
    assert dyn["speedup_vs"]["static-16-16"]["mean"] == pytest.approx(sum(ratios) / 3)
    # a configuration compared with itself: ratio 1 on every seed, no difference
    assert agg["static-16-16"]["speedup_within_spread"]["static-16-16"] is True
    assert main([*args, "--seeds", "0"]) == 2


def test_within_spread_marker() -> None:
    from dynsched_sim import Spread
    from dynsched_sim._report import _ratio

    noisy = Spread.of([0.99, 1.03, 1.01])
    clear = Spread.of([1.20, 1.21, 1.19])
    assert noisy.within_spread_of_one() and not clear.within_spread_of_one()
    assert _ratio(noisy).startswith("~") and not _ratio(clear).startswith("~")
    assert not Spread.of([1.0]).within_spread_of_one()  # one seed: no spread to judge by


def test_full_view_and_no_published_times_next_to_a_shorter_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--steps N`` (not the published step count): the published 120-step times are not
    printed as if comparable; ``--full`` prints the wide table."""
    args = ["--steps", "3", "--seeds", "1", "--no-plots", "--quiet", "--out", str(tmp_path)]
    assert main([*args, "--full"]) == 0
    text = capsys.readouterr().out
    assert "proxy/true" in text and "re-routed" in text
    assert "published dynamic-16-16" not in text
    assert "published wall-clock times are for 120 steps" in text
    assert "published" not in (tmp_path / "table.txt").read_text()


def test_a_scenario_that_stalls_every_run_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Speeds off by orders of magnitude (a prefill of 4 minutes per token) stall the
    pipeline for 30 simulated days: one line naming the run and the suspects, exit 2."""
    d = scenario_to_dict(load_scenario("balanced").with_steps(1))
    d["engine"]["prefill_s_per_token"] = 241
    d["configurations"] = [c for c in d["configurations"] if c["hybrid"]]
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(d))
    argv = ["--scenario", str(path), "--seeds", "1", "--quiet", "--no-plots"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err)
    assert "no progress for 30 simulated days" in errors[0]
    assert "engine.prefill_s_per_token" in errors[0]
