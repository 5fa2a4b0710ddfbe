"""An elastic trainer in a real run: resized 2 -> 3 -> 2 mid-run, does the loss curve stay
within the seed spread of runs that never resize?

Runs `dynsched train` (the `TrainRunner`, transformers engine, `TorchTrainer` over gloo) on
the shipped addition task, several seeds, two arms in one local Ray cluster:

- ``unresized``: 2 trainer workers and 2 standalone replicas throughout;
- ``resized``: the same run, whose trainer pool holds one more GPU (3: the trainer starts
  with 2 workers, as ``dynsched train --planner`` starts it); a scripted role planner
  retires a standalone replica and grows the trainer to 3 workers at sync ``--grow-at``,
  then shrinks it back to 2 and starts the replica again at sync ``--shrink-at``. The
  moves are the real ones (`RayRoleMover`: unroute, abort and resume elsewhere, the
  optimizer state re-formed over the new data-parallel group, the global batch kept).

The criterion, stated before the runs: at every step from the first resize on, the mean
over seeds of the resized runs' training loss lies within the range (min..max over
seeds) of the unresized runs' loss at that step; and the last-quarter reward of the two
arms is equivalent by a two one-sided Welch t-test (margin 0.05 reward, as in
``train_compare.py``). Writes ``summary.json`` and ``loss.png`` to ``--out``.

That loss criterion fails often with no effect at all: the mean of 5 runs falls outside
the range of 5 others drawn alike about one step in seven (normal draws), so across the
14 judged steps of the first run (seeds 0-4) some step falls outside in most cases.
The runs are paired by seed (the same prompts; a seed's two runs are identical up to the
first weight sync). Of the 32 ways to swap the arms within seeds, 31 put at least one
judged step outside (on average 2.2); the first run's real labels put 1 step outside, by
0.0004. So a second criterion, stated after that run and before any run of seeds 5-9
(2026-12-05): over every swap of the arms within seeds (all of them, or 20,000 drawn with
a fixed seed where there are more), the share with at least as many judged steps outside
as the real labels is at least 0.05 (`relabelling`), on 8 seeds (5-12). A shift of the
resized runs' loss beyond the seed spread puts more steps outside than most swaps do;
runs alike put about as many. The test is two-sided, so the full swap always counts as
many as the real labels: with 5 seeds no share falls below 2/32, and the first run's
share says only that it shows no sign of a shift; 8 seeds can reject down to 2/256. ``--reverdict`` recomputes the verdict of an existing ``summary.json``
in ``--out`` without running anything.

The replication met both loss criteria, but its last-quarter reward was not equivalent
(resized lower on 8 of 8 seeds). The resized arm differs from the unresized one in more
than its moves: its trainer pool holds 3 GPUs, so it also runs 3 hybrid replicas instead
of 2. A control arm, ``same_fleet`` (that fleet and trainer, a planner that never moves),
stated before it ran (2026-12-05): ``--arms same_fleet --seeds 5 ... 12 --against
benchmarks/results/train_resize_seeds5-12/summary.json`` reports the reward TOST of the
control against ``unresized`` (what the fleet does) and of ``resized`` against the
control (what the moves do), same margin.

Usage::

    hatch run test:python benchmarks/train_resize.py --seeds 0 1 2 3 4 \\
        --out benchmarks/results/train_resize
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_worker_niceness", "0")  # see train_compare.py

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_compare import CONFIG, tost
from train_compare import run_one as compare_run

ARMS = ("unresized", "resized")
#: a control arm: the ``resized`` arm's fleet and trainer (a 3-GPU trainer pool, 2 workers,
#: 3 hybrid replicas) with a planner that never moves; ``--arms same_fleet --against
#: OUT/summary.json`` separates what the resize does from what that fleet does
CONTROL = "same_fleet"


def arm_config(arm: str) -> dict[str, Any]:
    """2 trainer GPUs (3 for ``resized``: room to grow) and 2 standalone replicas, the
    ``default`` policy; the rest as ``train_compare.CONFIG`` (the same global batch)."""
    if arm not in (*ARMS, CONTROL):
        raise ValueError(f"arm must be one of {[*ARMS, CONTROL]}, got {arm!r}")
    cfg = json.loads(json.dumps(CONFIG))
    cfg["async_training"]["dynamic_schedule_policy"] = "default"
    cfg["trainer"]["n_gpus_per_node"] = 2 if arm == "unresized" else 3
    cfg["rollout"]["n_gpus_per_node"] = 2
    return cfg


def scripted_planner(config: Any, grow_at: int | None, shrink_at: int | None) -> Any:
    """A `RolePlanner` whose decisions are scripted: one replica's GPUs to the trainer at
    sync ``grow_at``, back to rollout at sync ``shrink_at`` (it still observes the run;
    None: never)."""
    from dynsched_core.planner import RoleMove, RolePlanner, RolePlannerOptions, RoleSplit

    class ScriptedPlanner(RolePlanner):
        def __init__(self) -> None:
            super().__init__(RolePlannerOptions(every_n_syncs=1), config=config)
            self.syncs = 0

        def decide(self, split: RoleSplit, *, now: float) -> RoleMove | None:
            self.syncs += 1
            script = {grow_at: "to_trainer", shrink_at: "to_rollout"}
            direction = script.get(self.syncs)
            if direction is None:
                return None
            after = split.moved(direction, 1)  # type: ignore[arg-type]
            return RoleMove(
                direction=direction,  # type: ignore[arg-type]
                replicas=1,
                before=split,
                after=after,
                reason=f"scripted at sync {self.syncs}",
            )

    return ScriptedPlanner()


def run_one(arm: str, seed: int, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """`train_compare.run_one` on the arm's config (the scripted planner for ``resized``),
    plus the trainer workers after each step and the moves."""
    from dynsched_core import DynamicScheduleConfig

    cfg = arm_config(arm)
    config = DynamicScheduleConfig.from_dict(cfg)
    planner = None
    if arm == "resized":
        planner = scripted_planner(config, args.grow_at, args.shrink_at)
    elif arm == CONTROL:  # the trainer starts below its pool, as with a planner; no moves
        planner = scripted_planner(config, None, None)
    workers: list[int] = []  # trainer workers after each step (the group's size)

    def on_step(runner: Any, _row: dict[str, Any]) -> None:
        group = runner.trainer_group
        workers.append(len(group.workers) if group is not None else 0)

    run = compare_run(arm, seed, args, model, config_dict=cfg, planner=planner, on_step=on_step)
    at = {"to_trainer": args.grow_at, "to_rollout": args.shrink_at}
    moves = [
        {"direction": m.direction, "at_sync": at[m.direction], "seconds": round(s, 3)}
        for m, s in (planner.moves if planner is not None else [])
    ]
    return {**run, "arm": arm, "trainer_workers": workers, "moves": moves}


#: relabellings drawn (with ``RELABEL_SEED``) where there are more ways to swap the arms
RELABEL_DRAWS = 20_000
RELABEL_SEED = 0


def _inside(mean: float, values: list[float]) -> bool:
    """The stated criterion at one step: ``mean`` within the range of ``values`` (float-sum
    rounding only, 1e-9: the mean of equal losses is not always equal)."""
    return min(values) - 1e-9 <= mean <= max(values) + 1e-9


def _outside(curves: list[list[float]], group: set[int], judged: range) -> int:
    """Judged steps (0-based) at which the mean loss of the runs in ``group`` lies outside
    the range of the other runs' loss."""
    n = 0
    for i in judged:
        mean = statistics.fmean(curves[k][i] for k in group)
        n += not _inside(mean, [curves[k][i] for k in range(len(curves)) if k not in group])
    return n


def relabelling(runs: list[dict[str, Any]], first_resize_step: int) -> dict[str, Any]:
    """How many judged steps fall outside when the two runs of each seed swap arms, in
    every combination (or `RELABEL_DRAWS` drawn at random), against the real labels: the
    share of relabellings with at least as many outside is the chance of seeing so many
    with no difference between the arms. The runs are paired by seed (the same prompts;
    identical up to the first weight sync), so labels are exchanged within a seed only."""
    import itertools
    import random

    steps = min(r["steps"] for r in runs)
    curves = [list(r["loss"][:steps]) for r in runs]
    judged = range(first_resize_step - 1, steps)
    pairs: dict[int, dict[str, int]] = {}
    for k, r in enumerate(runs):
        pairs.setdefault(r["seed"], {})[r["arm"]] = k
    seeds = sorted(s for s, p in pairs.items() if set(p) == set(ARMS))
    if len(seeds) != len(pairs):
        raise ValueError("relabelling needs both arms of every seed")
    observed = _outside(curves, {pairs[s]["resized"] for s in seeds}, judged)
    exhaustive = 2 ** len(seeds) <= RELABEL_DRAWS
    if exhaustive:
        flips = list(itertools.product((False, True), repeat=len(seeds)))
    else:
        rng = random.Random(RELABEL_SEED)
        flips = [tuple(rng.random() < 0.5 for _ in seeds) for _ in range(RELABEL_DRAWS)]
    counts = [
        _outside(
            curves,
            {pairs[s]["unresized" if f else "resized"] for s, f in zip(seeds, flip, strict=True)},
            judged,
        )
        for flip in flips
    ]
    return {
        "outside_observed": observed,
        "relabellings": len(counts),
        "exhaustive": exhaustive,
        "mean_outside": statistics.fmean(counts),
        "share_none_outside": sum(c == 0 for c in counts) / len(counts),
        "p_at_least_observed": sum(c >= observed for c in counts) / len(counts),
    }


def check(runs: list[dict[str, Any]], first_resize_step: int) -> dict[str, Any]:
    """The stated criterion (module docstring) on ``runs``."""
    by = {a: [r for r in runs if r["arm"] == a] for a in ARMS}
    steps = min(r["steps"] for r in runs)
    per_step = []
    for i in range(steps):
        base = [r["loss"][i] for r in by["unresized"]]
        mean = statistics.fmean(r["loss"][i] for r in by["resized"])
        per_step.append(
            {
                "step": i + 1,
                "resized_mean": mean,
                "unresized_min": min(base),
                "unresized_max": max(base),
                "unresized_mean": statistics.fmean(base),
                "inside": _inside(mean, base),
            }
        )
    judged = [p for p in per_step if p["step"] >= first_resize_step]
    last = {a: [r["last_quarter_reward"] for r in by[a]] for a in ARMS}
    shuffled = relabelling(runs, first_resize_step)
    return {
        "first_resize_step": first_resize_step,
        "per_step": per_step,
        "steps_inside": sum(p["inside"] for p in judged),
        "steps_judged": len(judged),
        "loss_within_seed_spread": all(p["inside"] for p in judged),
        "relabelling": shuffled,
        "loss_within_seed_spread_by_relabelling": shuffled["p_at_least_observed"] >= 0.05,
        "reward_tost": tost(last["resized"], last["unresized"], 0.05, 0.05),
        "every_resized_run_moved_twice": all(len(r["moves"]) == 2 for r in by["resized"]),
        "resized_reached_3_workers": all(max(r["trainer_workers"]) == 3 for r in by["resized"]),
        "resized_ended_at_2_workers": all(r["trainer_workers"][-1] == 2 for r in by["resized"]),
        "no_duplicates": all(r["duplicate_samples"] == 0 for r in runs),
    }


def plot(runs: list[dict[str, Any]], verdict: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ps = verdict["per_step"]
    steps = [p["step"] for p in ps]
    ax.fill_between(
        steps,
        [p["unresized_min"] for p in ps],
        [p["unresized_max"] for p in ps],
        color="tab:blue",
        alpha=0.2,
        label="unresized: range over seeds",
    )
    ax.plot(steps, [p["unresized_mean"] for p in ps], color="tab:blue", label="unresized mean")
    for r in runs:
        if r["arm"] == "resized":
            ax.plot(steps, r["loss"][: len(steps)], color="tab:orange", alpha=0.3, lw=0.8)
    ax.plot(steps, [p["resized_mean"] for p in ps], color="tab:orange", label="resized mean")
    ax.axvline(verdict["first_resize_step"], color="grey", ls=":", label="first resize")
    ax.set(xlabel="step", ylabel="training loss", title="trainer resized 2 -> 3 -> 2 mid-run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=90)
    plt.close(fig)


def control_check(control: list[dict[str, Any]], against: dict[str, Any]) -> dict[str, Any]:
    """The control arm's last-quarter reward against the two arms of ``against`` (a
    ``summary.json`` of the same seeds): ``fleet`` (control against ``unresized``: what the
    3-GPU pool's fleet does) and ``resize`` (``resized`` against the control: what the
    moves do), each a TOST with the module's margin, with the per-seed differences."""
    by_seed = {(r["arm"], r["seed"]): r["last_quarter_reward"] for r in against["runs"]}
    seeds = sorted(r["seed"] for r in control)
    missing = [s for s in seeds if (ARMS[0], s) not in by_seed or (ARMS[1], s) not in by_seed]
    if missing:
        raise ValueError(f"--against has no runs of both arms for seeds {missing}")
    ctl = {r["seed"]: r["last_quarter_reward"] for r in control}
    un = [by_seed[(ARMS[0], s)] for s in seeds]
    re = [by_seed[(ARMS[1], s)] for s in seeds]
    c = [ctl[s] for s in seeds]
    return {
        "seeds": seeds,
        "fleet": {
            "per_seed": [a - b for a, b in zip(c, un, strict=True)],
            "tost": tost(c, un, 0.05, 0.05),
        },
        "resize": {
            "per_seed": [a - b for a, b in zip(re, c, strict=True)],
            "tost": tost(re, c, 0.05, 0.05),
        },
        "no_duplicates": all(r["duplicate_samples"] == 0 for r in control),
        "control_never_moved": all(not r["moves"] for r in control),
        "control_at_2_workers": all(set(r["trainer_workers"]) == {2} for r in control),
    }


def reverdict(out: Path) -> int:
    """The verdict of an existing ``summary.json`` recomputed from its runs (written back;
    the runs are kept as they are)."""
    path = out / "summary.json"
    if not path.is_file():
        print(f"--reverdict: no {path} to re-read", file=sys.stderr)
        return 2
    doc = json.loads(path.read_text())
    if "against" in doc:
        print(f"--reverdict: {path} is a {CONTROL} run; rerun it with --against", file=sys.stderr)
        return 2
    verdict = check(doc["runs"], doc["verdict"]["first_resize_step"])
    doc["verdict"] = verdict
    path.write_text(json.dumps(doc, indent=1))
    plot(doc["runs"], verdict, out)
    print(json.dumps({k: v for k, v in verdict.items() if k != "per_step"}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--grow-at", type=int, default=3, help="sync at which the trainer grows")
    ap.add_argument("--shrink-at", type=int, default=6, help="sync at which it shrinks back")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results/train_resize")
    ap.add_argument("--model-cache", default=".cache/dynsched-train-model")
    ap.add_argument("--num-cpus", type=int, default=4)
    ap.add_argument(
        "--arms",
        nargs="+",
        choices=[*ARMS, CONTROL],
        default=list(ARMS),
        help=f"arms to run (default both; {CONTROL!r}: the control arm, with --against)",
    )
    ap.add_argument(
        "--against",
        default=None,
        help=f"with --arms {CONTROL}: summary.json of a run of both arms on the same seeds",
    )
    ap.add_argument(
        "--reverdict",
        action="store_true",
        help="run nothing: recompute the verdict (and plot) of OUT/summary.json",
    )
    args = ap.parse_args(argv)
    if args.reverdict:
        return reverdict(Path(args.out))
    args.engine = "hf"  # train_compare.run_one's engine
    syncs = args.steps // CONFIG["async_training"]["trigger_parameter_sync_step"]
    if not 1 <= args.grow_at < args.shrink_at < syncs:
        ap.error(f"need 1 <= --grow-at < --shrink-at < {syncs} (the run's syncs)")
    if len(args.seeds) < 2:
        ap.error("--seeds: at least 2 (the criterion compares seed spreads)")
    control_only = args.arms == [CONTROL]
    if not control_only and sorted(args.arms) != sorted(ARMS):
        ap.error(f"--arms: both of {list(ARMS)}, or {CONTROL!r} alone (with --against)")
    against = None
    if control_only:
        if args.against is None or not Path(args.against).is_file():
            ap.error(f"--arms {CONTROL} needs --against SUMMARY.json (a run of both arms)")
        against = json.loads(Path(args.against).read_text())

    import ray
    from dynsched_ray.task.addition import warm_up

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = warm_up(args.model_cache)
    ray.init(
        address="local", num_cpus=args.num_cpus, num_gpus=6, include_dashboard=False,
        log_to_driver=False,
    )  # fmt: skip
    t0 = time.monotonic()
    runs = []
    try:
        for seed in args.seeds:
            for arm in args.arms:
                runs.append(run_one(arm, seed, args, model))
    finally:
        ray.shutdown()
    # the planner decides after a sync step: the first resized step is the one after it
    first_step = args.grow_at * CONFIG["async_training"]["trigger_parameter_sync_step"] + 1
    if against is not None:
        verdict = control_check(runs, against)
    else:
        verdict = check(runs, first_step)
        plot(runs, verdict, out)
    doc = {
        "command": "hatch run test:python benchmarks/train_resize.py " + " ".join(sys.argv[1:]),
        "configs": {a: arm_config(a) for a in args.arms},
        **({"against": args.against} if against is not None else {}),
        "seeds": args.seeds,
        "steps": args.steps,
        "total_wall_s": round(time.monotonic() - t0, 1),
        "verdict": verdict,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs],
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in verdict.items() if k != "per_step"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
