"""The statistics of ``benchmarks/train_compare.py``: the TOST against hand-computed cases
and each arm's configuration (the Ray runs themselves are the benchmark)."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "train_compare.py"


def _load(file: str):  # type: ignore[no-untyped-def]
    """A benchmark script as a module (``benchmarks/`` is not a package)."""
    path = _PATH.with_name(file)
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


tc = _load("train_compare.py")


def test_tost_hand_computed() -> None:
    # a - b = 0.01; var(a)/3 = var(b)/3 = 1e-4/3; se = sqrt(2e-4/3) = 0.0081650
    a, b = [0.51, 0.52, 0.53], [0.50, 0.51, 0.52]
    r = tc.tost(a, b, margin=0.05, alpha=0.05)
    se = math.sqrt(2 * 1e-4 / 3)
    assert r["difference"] == pytest.approx(0.01)
    assert r["se"] == pytest.approx(se)
    assert r["df"] == pytest.approx(4.0)  # Welch with equal variances and sizes: 2n - 2
    # t statistics: (0.01 + 0.05) / se = 7.348, (0.01 - 0.05) / se = -4.899; t(4) tails
    assert r["p_lower"] == pytest.approx(0.000917, rel=0.01)
    assert r["p_upper"] == pytest.approx(0.004022, rel=0.01)
    assert r["p"] == r["p_upper"] and r["equivalent"]


def test_tost_refuses_a_difference_beyond_the_margin() -> None:
    r = tc.tost([0.60, 0.61, 0.62], [0.50, 0.51, 0.52], margin=0.05, alpha=0.05)
    assert r["difference"] == pytest.approx(0.10) and not r["equivalent"]
    assert r["p_upper"] > 0.5


def test_tost_needs_two_seeds() -> None:
    with pytest.raises(ValueError, match="2 seeds"):
        tc.tost([0.5], [0.5, 0.6], margin=0.05, alpha=0.05)


@given(
    st.lists(st.floats(0, 1), min_size=2, max_size=6),
    st.lists(st.floats(0, 1), min_size=2, max_size=6),
    st.floats(0.001, 0.5),
)
def test_tost_equivalent_only_inside_the_margin(a: list[float], b: list[float], m: float) -> None:
    r = tc.tost(a, b, margin=m, alpha=0.05)
    assert 0.0 <= r["p"] <= 1.0
    if r["equivalent"]:  # both nulls rejected: the observed difference lies inside the margin
        assert abs(statistics.fmean(a) - statistics.fmean(b)) < m


def test_planner_arm_has_room_to_grow() -> None:
    base, arm = tc.arm_config("default"), tc.arm_config("default+planner")
    assert arm["async_training"]["dynamic_schedule_policy"] == "default"
    assert arm["trainer"]["n_gpus_per_node"] == base["trainer"]["n_gpus_per_node"] + 1
    assert arm["actor_rollout_ref"] == base["actor_rollout_ref"]  # the same global batch
    assert tc.CONFIG["trainer"]["n_gpus_per_node"] == 1  # CONFIG itself untouched


def test_bad_arm_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        tc.main(["--policies", "static_fully_async", "nosuchpolicy"])
    assert exc.value.code == 2
    assert "--policies nosuchpolicy" in capsys.readouterr().err


# ---------------------------------------------------------------- train_resize.py
tr = _load("train_resize.py")


def _run(arm: str, seed: int, loss: list[float]) -> dict:  # type: ignore[type-arg]
    moved = arm == "resized"
    return {
        "arm": arm,
        "seed": seed,
        "loss": loss,
        "steps": len(loss),
        "last_quarter_reward": 0.5 + 0.01 * seed,
        "moves": [{}, {}] if moved else [],
        "trainer_workers": [2, 3, 3, 2] if moved else [2, 2, 2, 2],
        "duplicate_samples": 0,
    }


def test_resize_criterion_inside_and_outside_the_seed_band() -> None:
    base = [_run("unresized", s, [1.0, 0.9 + 0.02 * s, 0.8 + 0.02 * s, 0.7]) for s in range(3)]
    near = [_run("resized", s, [1.0, 0.92, 0.82, 0.7]) for s in range(3)]
    v = tr.check(base + near, first_resize_step=2)
    assert v["loss_within_seed_spread"] and v["steps_judged"] == 3
    assert v["resized_reached_3_workers"] and v["resized_ended_at_2_workers"]
    far = [_run("resized", s, [1.0, 0.92, 0.95, 0.7]) for s in range(3)]  # step 3 leaves it
    v = tr.check(base + far, first_resize_step=2)
    assert not v["loss_within_seed_spread"] and v["steps_inside"] == 2
    # a step before the first resize is shown but not judged
    early = [_run("resized", s, [2.0, 0.92, 0.82, 0.7]) for s in range(3)]
    assert tr.check(base + early, first_resize_step=2)["loss_within_seed_spread"]


def test_resize_relabelling_tells_a_shift_from_seed_noise() -> None:
    """The swap test (arms exchanged within each seed): a resized arm shifted far above the
    band at every judged step is outside at all of them, and only the real labels and the
    full swap put as many outside (p = 2/2**6 with 6 seeds; with 5 no split can reach
    0.05); arms drawn alike put about as many steps outside as their swaps."""
    import random

    rng = random.Random(7)
    seeds, steps = range(6), 12

    def noisy(arm: str, s: int, shift: float) -> dict:  # type: ignore[type-arg]
        return _run(arm, s, [1.0] + [rng.gauss(0.0, 0.01) + shift for _ in range(steps - 1)])

    base = [noisy("unresized", s, 0.0) for s in seeds]
    far = [noisy("resized", s, 1.0) for s in seeds]
    v = tr.check(base + far, first_resize_step=2)
    r = v["relabelling"]
    assert r["exhaustive"] and r["relabellings"] == 64
    assert r["outside_observed"] == steps - 1
    assert r["p_at_least_observed"] == pytest.approx(2 / 64)
    assert not v["loss_within_seed_spread_by_relabelling"]
    alike = [noisy("resized", s, 0.0) for s in seeds]
    v = tr.check(base + alike, first_resize_step=2)
    assert v["relabelling"]["p_at_least_observed"] >= 0.05
    assert v["loss_within_seed_spread_by_relabelling"]
    with pytest.raises(ValueError, match="both arms of every seed"):
        tr.relabelling(base + alike[:5], first_resize_step=2)
    # five seeds: even the far shift is not rejected (the smallest share is 2/32)
    v5 = tr.check(base[:5] + far[:5], first_resize_step=2)
    assert v5["relabelling"]["p_at_least_observed"] == pytest.approx(2 / 32)


def test_resize_arms_keep_the_global_batch() -> None:
    un, re = tr.arm_config("unresized"), tr.arm_config("resized")
    assert (un["trainer"]["n_gpus_per_node"], re["trainer"]["n_gpus_per_node"]) == (2, 3)
    assert un["actor_rollout_ref"] == re["actor_rollout_ref"] == tc.CONFIG["actor_rollout_ref"]
    with pytest.raises(ValueError, match="arm must be one of"):
        tr.arm_config("bogus")


def test_scripted_planner_grows_then_shrinks() -> None:
    from dynsched_core import DynamicScheduleConfig
    from dynsched_core.planner import RoleSplit

    config = DynamicScheduleConfig.from_dict(tr.arm_config("resized"))
    planner = tr.scripted_planner(config, grow_at=2, shrink_at=4)
    split = RoleSplit(trainer_gpus=2, standalone_replicas=2, gpus_per_replica=1)
    decisions = []
    for _ in range(5):
        move = planner.decide(split, now=0.0)
        decisions.append(None if move is None else move.direction)
        if move is not None:
            split = move.after
    assert decisions == [None, "to_trainer", None, "to_rollout", None]
    assert (split.trainer_gpus, split.standalone_replicas) == (2, 2)


def test_resize_control_arm_has_the_resized_fleet_and_never_moves() -> None:
    assert tr.arm_config(tr.CONTROL) == tr.arm_config("resized")
    from dynsched_core import DynamicScheduleConfig
    from dynsched_core.planner import RoleSplit

    p = tr.scripted_planner(DynamicScheduleConfig.from_dict(tr.arm_config(tr.CONTROL)), None, None)
    split = RoleSplit(trainer_gpus=2, standalone_replicas=2, gpus_per_replica=1)
    assert all(p.decide(split, now=float(t)) is None for t in range(12))


def test_resize_control_check_separates_fleet_and_moves() -> None:
    """Control equal to unresized, resized 0.1 lower: the fleet is equivalent, the moves
    are not; a seed missing from ``--against`` is one clear error."""
    seeds = range(6)

    def run(arm: str, s: int, reward: float) -> dict:  # type: ignore[type-arg]
        r = _run(arm, s, [1.0, 0.9])
        r["last_quarter_reward"] = reward
        if arm == tr.CONTROL:
            r["moves"], r["trainer_workers"] = [], [2, 2, 2, 2]
        return r

    against = {
        "runs": [run("unresized", s, 0.5 + 0.01 * s) for s in seeds]
        + [run("resized", s, 0.4 + 0.01 * s) for s in seeds]
    }
    control = [run(tr.CONTROL, s, 0.5 + 0.01 * s + (0.001 if s % 2 else -0.001)) for s in seeds]
    v = tr.control_check(control, against)
    assert v["seeds"] == list(seeds)
    assert v["fleet"]["tost"]["equivalent"] and not v["resize"]["tost"]["equivalent"]
    assert v["resize"]["per_seed"] == pytest.approx(
        [-0.1 + (0.001 if s % 2 == 0 else -0.001) for s in seeds]
    )
    assert v["control_never_moved"] and v["control_at_2_workers"] and v["no_duplicates"]
    with pytest.raises(ValueError, match=r"no runs of both arms for seeds \[7\]"):
        tr.control_check([*control, run(tr.CONTROL, 7, 0.5)], against)
