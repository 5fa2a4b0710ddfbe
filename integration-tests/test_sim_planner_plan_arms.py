"""``benchmarks/sim_planner.py``'s plan arms: the planning workload seeds never overlap the
evaluation seeds, a tiny run reports the arms' summary fields, and the
staleness-constrained arms take their bound from ``default`` on the planning seeds, keep
their pick within it there, and are added by ``--plan-only`` without touching the other
arms' runs (the families themselves are the benchmark)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_planner.py"


def _load() -> Any:
    """The benchmark script as a module (``benchmarks/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("sim_planner_under_test", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


sp = _load()


@pytest.mark.parametrize("quick", [False, True])
def test_planning_seeds_never_overlap_evaluation_seeds(quick: bool) -> None:
    evaluation: set[int] = set()
    planning: set[int] = set()
    for family in sp.ALL_FAMILIES:
        keys, k = sp._keys(family, quick)
        for key in keys:
            sc = sp._scenario(key)
            ev = sp._seeds(key, k)
            n = sp._plan_settings(quick)["seeds"]
            # the seeds plan() simulates: the planning scenario's seed onwards
            first = sp._planning_scenario(sc).seed
            pl = list(range(first, first + n))
            assert not set(ev) & set(pl), key
            evaluation |= set(ev)
            planning |= set(pl)
    # nor across scenarios and families
    assert not evaluation & planning


def test_plan_tasks_refuse_overlapping_seeds() -> None:
    knobs = {"concurrency": 16, "staleness_threshold": 0.5}
    pick = {"planning_seeds": [3, 4], "candidate": knobs, "dynamic": knobs}
    with pytest.raises(ValueError, match="overlap"):
        sp._plan_tasks("balanced", pick, [0, 1, 2, 3])
    assert len(sp._plan_tasks("balanced", pick, [0, 1])) == 2 * len(sp.PLAN_ARMS)
    with pytest.raises(ValueError, match="overlap"):
        sp._stale_tasks("balanced", pick, [0, 1, 2, 3])
    assert len(sp._stale_tasks("balanced", pick, [0, 1])) == 2 * len(sp.STALE_ARMS)


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """One built-in, 4 steps, one seed, a one-split shortlist: about a second."""
    scenario = sp._scenario
    monkeypatch.setattr(sp, "_scenario", lambda key: scenario(key).with_steps(4))
    monkeypatch.setattr(sp, "_keys", lambda family, quick: (["balanced"], 1))
    monkeypatch.setattr(sp, "PLAN_SHORTLIST", 1)


@pytest.mark.usefixtures("tiny")
def test_tiny_run_reports_the_plan_arms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = sp.run(["builtin"], True, 1, plan_arms=False)["families"]["builtin"]
    assert "plans" not in base and "plan_planner_s" not in base["scenarios"][0]
    (tmp_path / "sim_planner_quick_builtin.json").write_text(
        json.dumps({"instrument": "x", "quick": True, "families": {"builtin": base}})
    )
    # --plan-only: the existing arms' runs kept, the plan arms added
    assert sp.main(["--quick", "--family", "builtin", "--per-family", "--plan-only",
                    "--out", str(tmp_path)]) == 0  # fmt: skip
    got = json.loads((tmp_path / "sim_planner_quick_builtin.json").read_text())
    fam = got["families"]["builtin"]
    assert fam["complete"] and fam["other_arms_instrument"] == "x"
    s = fam["scenarios"][0]
    assert s["default_s"] == base["scenarios"][0]["default_s"]
    for arm in (
        "plan",
        "plan_planner",
        "plan_at_default_staleness",
        "plan_planner_at_default_staleness",
    ):
        for field in (
            f"{arm}_s",
            f"{arm}_vs_default",
            f"{arm}_vs_best_static",
            f"{arm}_within_1pct_of_best_static",
            f"{arm}_efficiency_min",
            f"staleness_{arm}",
            f"{arm}_staleness_at_or_below_default_within_spread",
            f"{arm}_vs_best_tuned_static",
        ):
            assert field in s, field
        for field in (
            f"geomean_{arm}_vs_default",
            f"geomean_{arm}_vs_best_static",
            f"{arm}_within_1pct_of_best_static",
            f"min_{arm}_efficiency",
            f"{arm}_staleness_at_or_below_default",
            f"{arm}_staleness_at_or_below_default_within_spread",
            f"geomean_{arm}_vs_best_tuned_static",
        ):
            assert field in fam["summary"], field
        # counting differences inside the seed spread as none only adds scenarios
        plain = fam["summary"][f"{arm}_staleness_at_or_below_default"]
        assert fam["summary"][f"{arm}_staleness_at_or_below_default_within_spread"] >= plain
    note = s["plan"]
    assert not set(note["planning_seeds"]) & set(note["evaluation_seeds"])
    assert note["evaluation_seeds"] == s["seeds"]
    arms = {None, "plan", "plan+planner", *sp.STALE_ARMS}
    assert arms <= {r.get("arm") for r in fam["runs"]}
    stale = s["stale_plan"]
    assert not set(stale["planning_seeds"]) & set(stale["evaluation_seeds"])
    assert stale["planning_seeds"] == note["planning_seeds"]
    assert stale["unconstrained_pick"] == note["pick"]
    assert stale["changed"] == (stale["pick"] != note["pick"])
    assert "stale_plan_changed_picks" in fam["summary"]
    # the derived arm: the pick's runs, or default's where the pick was slower on the
    # planning seeds (decided there only)
    keep = stale["planned_time_s"] <= stale["default_planning_time_s"]
    chosen = s["plan_at_default_staleness_s"] if keep else s["default_s"]
    assert s["plan_at_default_staleness_or_default_s"] == chosen
    assert "geomean_plan_at_default_staleness_or_default_vs_default" in fam["summary"]
    assert s["best_tuned_static_s"] <= s["best_static_s"]
    # a rerun reuses the cached plan and the plan arms' runs
    monkeypatch.setattr(sp, "_make_plan", lambda *a: pytest.fail("replanned"))
    monkeypatch.setattr(sp, "_make_stale_plan", lambda *a: pytest.fail("replanned"))
    monkeypatch.setattr(sp, "_one", lambda *a: pytest.fail("rerun"))
    again = sp.run(["builtin"], True, 1, existing={"builtin": fam}, plan_only=True)
    assert again["families"]["builtin"]["scenarios"][0] == s


def test_staleness_inside_the_seed_spread_counts_as_no_difference() -> None:
    # the arm's mean against the largest of default's per-seed means on the same seeds
    assert sp._inside([0.44, 0.45, 0.44], [0.45, 0.45, 0.44])  # below on the mean
    assert sp._inside([0.45, 0.45, 0.45], [0.4469, 0.4484, 0.45])  # inside default's spread
    assert not sp._inside([0.4474, 0.4474, 0.4474], [0.4469, 0.4469, 0.4453])  # above it
    assert not sp._inside([0.5, 0.5, 0.5], [0.45, 0.45, 0.45])


def _default_staleness(sc: Any, seeds: list[int]) -> float:
    from dynsched_sim import run_configuration

    runs = [run_configuration(sc, sp._dynamic(sc), "default", seed=k) for k in seeds]
    return sum(r.staleness["mean"] for r in runs) / len(runs)


def test_stale_plan_bound_is_default_on_the_planning_seeds_and_holds_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """12 steps of ``colocated``: ``default``'s staleness differs between the planning and
    the evaluation seed, so a bound taken from the wrong seeds is caught; the unbounded
    plan's pick is over it on the planning seeds, so the bound changes the pick, and the
    new pick's simulated staleness there is within it (re-simulated here)."""
    scenario = sp._scenario
    monkeypatch.setattr(sp, "_scenario", lambda key: scenario(key).with_steps(12))
    monkeypatch.setattr(sp, "PLAN_SHORTLIST", 2)
    key = "colocated"
    sc = sp._scenario(key)
    free = sp._make_plan(key, True)
    got = sp._make_stale_plan(key, True, free)
    planning = got["planning_seeds"]
    assert planning == free["planning_seeds"] == [sc.seed + sp.PLAN_SEED_SHIFT]
    assert got["simulated_staleness_bound"] == _default_staleness(
        sp._planning_scenario(sc), planning
    )
    assert got["simulated_staleness_bound"] != _default_staleness(sc, [sc.seed])
    cand = sp._candidate(got)
    again = _simulated_staleness(cand.scenario_for(sp._planning_scenario(sc)), cand, planning)
    assert again == got["planned_simulated_staleness"]
    assert again <= got["simulated_staleness_bound"] + 1e-9
    assert got["changed"] and cand.name != free["candidate"]["name"]
    assert got["simulated_over_bound"] >= 1 and not got["fallback"]
    unbounded = sp._candidate(free)
    stale = _simulated_staleness(
        unbounded.scenario_for(sp._planning_scenario(sc)), unbounded, planning
    )
    assert stale > got["simulated_staleness_bound"]


def _simulated_staleness(sc: Any, cand: Any, seeds: list[int]) -> float:
    from dynsched_sim import run_configuration

    runs = [run_configuration(sc, cand.configuration(), cand.policy, seed=k) for k in seeds]
    return sum(r.staleness["mean"] for r in runs) / len(runs)


@pytest.mark.usefixtures("tiny")
def test_plan_only_adds_the_stale_arms_and_keeps_every_other_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file made before the staleness-constrained arms: ``--plan-only`` plans and runs only
    them; every run and plan already there is kept as it was."""
    fam = sp.run(["builtin"], True, 1, plan_arms=True)["families"]["builtin"]
    for k in ("stale_plans", "stale_plan_settings"):
        fam.pop(k)
    fam["runs"] = [r for r in fam["runs"] if r.get("arm") not in sp.STALE_ARMS]
    fam["plan_arms_instrument"] = "y"
    before = json.loads(json.dumps(fam))
    monkeypatch.setattr(sp, "_make_plan", lambda *a: pytest.fail("replanned"))
    got = sp.run(["builtin"], True, 1, existing={"builtin": fam}, plan_only=True)
    new = got["families"]["builtin"]
    assert new["runs"][: len(before["runs"])] == before["runs"]
    added = new["runs"][len(before["runs"]) :]
    assert added and {r["arm"] for r in added} == set(sp.STALE_ARMS)
    assert new["plans"] == before["plans"] and new["plan_arms_instrument"] == "y"
    assert new["plan_only_runs"][-1]["arms"] == sorted(sp.STALE_ARMS)
    old_s, new_s = before["scenarios"][0], new["scenarios"][0]
    assert {k: new_s[k] for k in old_s if k != "stale_plan"} == {
        k: v for k, v in old_s.items() if k != "stale_plan"
    }


@pytest.mark.usefixtures("tiny")
def test_replan_runs_again_only_the_arms_of_a_changed_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--plan-only --replan``: a plan made again with another pick replaces the cached
    one, its arms' runs are made again for the new pick, every other run is kept, and the
    bounded plan's comparison names the new pick; a second replan changing nothing runs
    nothing."""
    fam = sp.run(["builtin"], True, 1, plan_arms=True)["families"]["builtin"]
    before = json.loads(json.dumps(fam))
    key = before["scenarios"][0]["scenario"]
    old = before["plans"][key]["candidate"]
    split = "static-24-8" if old["trainer_gpus"] != 24 or old["hybrid"] else "static-16-16"
    real = sp._make_plan

    def other_pick(k: str, quick: bool) -> dict[str, Any]:
        p = real(k, quick)
        t, r = (int(x) for x in split.split("-")[1:])
        p["candidate"] = {**p["candidate"], "trainer_gpus": t, "rollout_gpus": r,
                          "hybrid": False, "policy": "static_fully_async"}  # fmt: skip
        c = p["candidate"]
        c["name"] = f"{split}/static_fully_async/c{c['concurrency']}/s{c['staleness_threshold']:g}"
        return p

    monkeypatch.setattr(sp, "_make_plan", other_pick)
    got = sp.run(["builtin"], True, 1, existing={"builtin": fam}, plan_only=True, replan=True)
    new = got["families"]["builtin"]
    assert new["plans"][key]["candidate"]["name"] != old["name"]
    plan_rows = [r for r in new["runs"] if r.get("arm") in sp.PLAN_ARMS]
    assert plan_rows and {r["configuration"] for r in plan_rows} == {split}

    def others(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in runs if r.get("arm") not in (*sp.PLAN_ARMS, sp.STATIC_AT_PLAN)]

    assert others(new["runs"]) == others(before["runs"])
    stale = new["stale_plans"][key]
    assert stale["unconstrained_pick"] == new["plans"][key]["candidate"]["name"]
    assert stale["candidate"] == before["stale_plans"][key]["candidate"]
    assert new["plan_only_runs"][-1]["plans_made"]["replanned"] == 1
    # nothing changes on a second replan: nothing runs
    monkeypatch.setattr(sp, "_one", lambda *a: pytest.fail("rerun"))
    again = sp.run(["builtin"], True, 1, existing={"builtin": new}, plan_only=True, replan=True)
    assert again["families"]["builtin"]["runs"] == new["runs"]


def test_replan_goes_with_plan_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        sp.main(["--family", "fresh", "--per-family", "--replan"])
    assert e.value.code == 2
    assert "--replan goes with --plan-only" in capsys.readouterr().err


@pytest.mark.usefixtures("tiny")
def test_rebound_rereads_every_run_against_the_bound_without_simulating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--rebound``: every stored run's efficiency is recomputed from the bound the run
    reports (`run_lower_bound`), the summaries made anew, and nothing is simulated."""
    fam = sp.run(["builtin"], True, 1, plan_arms=True)["families"]["builtin"]
    want = [r["efficiency"] for r in fam["runs"]]
    summary = json.loads(json.dumps(fam["summary"]))
    assert any(r.get("arm") for r in fam["runs"]) and any(
        r["policy"].endswith("+planner") for r in fam["runs"]
    )
    for r in fam["runs"]:  # as if measured against another bound
        r["efficiency"] = 0.5
    fam["summary"] = {}
    path = tmp_path / "sim_planner_quick_builtin.json"
    path.write_text(json.dumps({"instrument": "x", "quick": True, "families": {"builtin": fam}}))
    monkeypatch.setattr(sp, "_one", lambda *a: pytest.fail("simulated"))
    monkeypatch.setattr(sp, "_make_plan", lambda *a: pytest.fail("replanned"))
    assert sp.main(["--quick", "--family", "builtin", "--per-family", "--rebound",
                    "--out", str(tmp_path)]) == 0  # fmt: skip
    got = json.loads(path.read_text())["families"]["builtin"]
    assert [r["efficiency"] for r in got["runs"]] == want
    assert got["summary"] == summary
    assert got["rebound"] == {"runs": len(want), "efficiencies_changed": len(want)}
    assert got["bound_instrument"]


def test_rebound_without_a_result_file_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        sp.main(["--family", "fresh", "--per-family", "--rebound", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "--rebound: no result file to re-read" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["colocated", "rollout-bound"])
def test_the_or_default_arm_is_what_plan_picks_with_the_scenario_bound(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OR_DEFAULT` (the bounded pick where it was at least as fast as ``default`` on the
    planning seeds, else ``default``) is the pick of ``dynsched plan
    --simulated-staleness-bound scenario`` on the same seeds: the benchmark's figures for
    that arm are the command's. Every plan ranks the scenario's own configuration
    (``default``'s), so the bounded pick is never slower than ``default`` on the planning
    seeds: on 12 steps ``rollout-bound`` picks another configuration and ``colocated``
    picks ``default``'s own (both ways are checked)."""
    from dynsched_sim._plan import SCENARIO_STALENESS, own_candidate, plan

    scenario = sp._scenario
    monkeypatch.setattr(sp, "_scenario", lambda k: scenario(k).with_steps(12))
    monkeypatch.setattr(sp, "PLAN_SHORTLIST", 2)
    sc = sp._scenario(key)
    stale = sp._make_stale_plan(key, True, sp._make_plan(key, True))
    keep = stale["planned_time_s"] <= stale["default_planning_time_s"]
    derived = sp._candidate(stale) if keep else sp._default_candidate(sc)
    p = plan(
        sp._planning_scenario(sc),
        gpus=sp._dynamic(sc).total_gpus,
        seeds=1,
        shortlist=2,
        simulated_staleness_bound=SCENARIO_STALENESS,
    )
    assert p.best.candidate == derived
    assert p.simulated_staleness_bound == stale["simulated_staleness_bound"]
    assert keep
    assert (p.best.candidate == own_candidate(sc)) == (key == "colocated")
