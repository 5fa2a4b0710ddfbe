"""``benchmarks/sim_planner.py``'s plan arms: the planning workload seeds never overlap the
evaluation seeds, and a tiny run reports the arms' summary fields (the families
themselves are the benchmark)."""

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
    for family in sp.FAMILIES:
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
    for arm in ("plan", "plan_planner"):
        for field in (
            f"{arm}_s",
            f"{arm}_vs_default",
            f"{arm}_vs_best_static",
            f"{arm}_within_1pct_of_best_static",
            f"{arm}_efficiency_min",
            f"staleness_{arm}",
            f"{arm}_vs_best_tuned_static",
        ):
            assert field in s, field
        for field in (
            f"geomean_{arm}_vs_default",
            f"geomean_{arm}_vs_best_static",
            f"{arm}_within_1pct_of_best_static",
            f"min_{arm}_efficiency",
            f"{arm}_staleness_at_or_below_default",
            f"geomean_{arm}_vs_best_tuned_static",
        ):
            assert field in fam["summary"], field
    note = s["plan"]
    assert not set(note["planning_seeds"]) & set(note["evaluation_seeds"])
    assert note["evaluation_seeds"] == s["seeds"]
    assert {None, "plan", "plan+planner"} <= {r.get("arm") for r in fam["runs"]}
    assert s["best_tuned_static_s"] <= s["best_static_s"]
    # a rerun reuses the cached plan and the plan arms' runs
    monkeypatch.setattr(sp, "_make_plan", lambda *a: pytest.fail("replanned"))
    monkeypatch.setattr(sp, "_one", lambda *a: pytest.fail("rerun"))
    again = sp.run(["builtin"], True, 1, existing={"builtin": fam}, plan_only=True)
    assert again["families"]["builtin"]["scenarios"][0] == s
