"""Check: the run-time role planner against `default` and the best static split.

For every scenario: the scenario's dynamic configuration with its lending policy
(``default``), the same with the role planner on top (``default+planner``: it moves GPUs
between the trainer and the standalone pool, both ways, while the run goes on), and every
static split of the same GPUs (``static_fully_async``; trainer GPUs in whole replicas, at
least one replica on each side, splits whose trainer state does not fit left out). The
best static split is the one with the lowest mean over the scenario's seeds.

Families (nothing was tuned on the held-out and fresh ones; the planner was developed on
the built-ins and held-out draws 0-59 of `dynsched_sim._heldout`):

- ``builtin``: every built-in scenario x 5 workload seeds;
- ``heldout``: held-out draws 1000-1019 x 3 seeds;
- ``fresh``: a fresh held-out family, draws 2000-2019 x 3 seeds;
- ``dev``: development draws 0-19 x 3 seeds (of the draws 0-59 the planner was developed
  on: a change to the planner is judged here first, the held-out families read last).
  Not in the default ``--family`` list.
- ``fresh2``: a second fresh held-out family, draws 3000-3019 x 3 seeds, first run for
  ``dynsched plan --simulated-staleness-bound scenario`` (the arm
  ``plan@default-staleness-or-default``), after that rule was chosen on the built-ins and
  ``dev`` (the held-out and fresh families had been seen). Not in the default list.
- ``fresh3``: a third fresh held-out family, draws 4000-4019 x 3 seeds, first run after
  every plan began to rank the scenario's own configuration (a change decided on
  ``dev``). Not in the default list.

Reports per scenario the planner's time against ``default`` and against the best static
split (mean, and the per-seed range: seed spread), the planner's moves, its efficiency
against the lower bound and its mean staleness against ``default``'s; per family the
geometric means and how many scenarios are within 1% of the best static split (a
difference inside the seed spread counts as none). Targets (issue 29): within 1% of the
best static split on every scenario; geometric mean >= 10% below ``default`` on the
held-out draws; moonshot: geometric mean >= 3% below the best static split.

Two more arms put the offline planner (`dynsched_sim._plan.plan`, what ``dynsched plan``
runs) in front: ``plan`` plans the dynamic configuration's GPU budget on planning workload
seeds (the scenario's seed + ``PLAN_SEED_SHIFT`` onwards: never an evaluation seed, which
run from the scenario's seed up; both recorded per scenario), then runs the plan's best
candidate (split, hybrid, policy, concurrency, staleness threshold) on the evaluation
seeds; ``plan+planner`` runs the same candidate with the run-time role planner on top.
Where the pick's concurrency or threshold differs from the scenario's, ``static@plan`` runs
every static split at the pick's knobs; the *best tuned static split* (the best of those
and of the static splits at the scenario's knobs) is the baseline that gets the knobs the
plan tuned, reported beside the best static split of the targets.
The plan of each scenario (its pick, planning seeds and seconds) is kept in the family's
``plans`` and reused when the file is rerun.

Two staleness-constrained arms, ``plan@default-staleness`` and
``plan+planner@default-staleness``, plan the same budget on the same planning seeds with
one more bound: the plan's pick must keep its *simulated* mean staleness over the
planning seeds at or below that of the scenario's ``default`` configuration (its dynamic
configuration with ``default``) simulated on those same planning seeds
(`plan`'s ``simulated_staleness_bound``). Both sides are measured by the simulator on the
same seeds, so the comparison carries no closed-form error; the closed-form bound (the
scenario's threshold) still prefilters, as in ``plan``. The evaluation seeds are never
used to set the bound. Where no simulated candidate meets it, the arm runs the
``default`` configuration itself (which meets it by construction; counted as a
fallback). Their plans are cached in ``stale_plans``, with whether the bound changed the
pick from ``plan``'s. ``plan@default-staleness-or-default`` has no runs of its own: it
reports ``plan@default-staleness``'s runs, or ``default``'s where the bounded pick was
slower than ``default`` on the planning seeds (decided on those seeds only): the pick of
``dynsched plan --simulated-staleness-bound scenario`` on the planning seeds (checked in
``integration-tests/test_sim_planner_plan_arms.py``). Since every plan ranks the
scenario's own configuration (``default``'s here), no plan's pick is slower than
``default`` on the planning seeds where ``default`` could be picked, and that arm's runs
are ``plan@default-staleness``'s. ``--plan-only`` runs only the plan arms against the existing ``sim_planner_FAMILY.json`` files (the runs already there are kept;
only what is missing runs) and merges them in; ``--no-plan`` leaves them out. With
``--replan`` as well, every cached plan is made again (after a change of the plan or of
the lower bound, which floors the estimates that order a plan's shortlist); where a pick
changed, the new plan replaces the cached one and only the runs of the arms it feeds are
made again.

    OMP_NUM_THREADS=1 python benchmarks/sim_planner.py [--quick] [--jobs N] [--out FILE]
        [--family builtin heldout fresh] [--per-family] [--until HH:MM]
        [--no-plan | --plan-only [--replan]]

``--rebound`` simulates nothing: it re-reads every run of the existing result file(s)
against the current lower bound (`dynsched_sim.run_lower_bound`: the bound the run
reported, from the same workload draw and splits) and rewrites their efficiencies and
summaries, with ``bound_instrument`` naming the commit of the bound (after a change of the
bound alone; the runs are deterministic).

``--quick``: 2 seeds of each built-in and the first 5 draws of each held-out family with 1
seed. Writes ``benchmarks/results/sim_planner.json`` (``sim_planner_quick.json`` with
``--quick``); ``--per-family`` writes one file per family instead,
``sim_planner_FAMILY.json``, rewritten after every scenario (a family cut short by
``--until HH:MM``, UTC, is kept with ``complete: false``). Progress and an estimate of the
time left go to stderr. ``instrument`` names the commit measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

RESULTS = Path(__file__).parent / "results"
FAMILIES = ("builtin", "heldout", "fresh")
#: every family ``--family`` accepts (``dev``, ``fresh2`` and ``fresh3`` only when named)
ALL_FAMILIES = (*FAMILIES, "dev", "fresh2", "fresh3")
FIRST = {"heldout": 1000, "fresh": 2000, "dev": 0, "fresh2": 3000, "fresh3": 4000}
#: Planning workload seeds start at the scenario's seed plus this: above every evaluation
#: seed of every family (built-ins 0-4, draws 0-21, 1000-1021, 2000-2021, 3000-3021 and
#: 4000-4021).
PLAN_SEED_SHIFT = 100_000
#: `plan`'s settings: workload seeds simulated per candidate (1 with ``--quick``) and
#: splits shortlisted (its defaults).
PLAN_SEEDS = 3
PLAN_SHORTLIST = 4
#: The two arms that start from the plan's pick.
PLAN_ARMS = ("plan", "plan+planner")
#: The two arms that start from the pick of a plan whose simulated mean staleness on the
#: planning seeds is bounded by ``default``'s on the same seeds.
STALE_ARMS = ("plan@default-staleness", "plan+planner@default-staleness")
#: Derived from runs already made, no run of its own: ``plan@default-staleness``'s runs
#: where its pick was at least as fast as ``default`` on the planning seeds, else
#: ``default``'s (which meets the bound by construction). Decided on the planning seeds only.
OR_DEFAULT = "plan@default-staleness-or-default"


def _field(arm: str) -> str:
    """An arm's prefix in the summary fields: ``plan_planner``,
    ``plan_planner_at_default_staleness``, ``plan_at_default_staleness_or_default``."""
    return arm.replace("+", "_").replace("@", "_at_").replace("-", "_")


#: Every static split at the plan's concurrency and staleness threshold (run where they
#: differ from the scenario's). The *best tuned static split* is the best of these and of
#: the static splits at the scenario's own knobs: a baseline that gets the knobs the plan
#: tuned (the best static split of the issue's targets keeps the scenario's knobs).
STATIC_AT_PLAN = "static@plan"


def _scenario(key: str) -> Any:
    from dynsched_sim import load_scenario
    from dynsched_sim._heldout import heldout_scenario

    if key.startswith("draw:"):
        return heldout_scenario(int(key[5:]))
    return load_scenario(key)


def _dynamic(sc: Any) -> Any:
    return next(c for c in sc.configurations if c.hybrid)


def _static_splits(sc: Any) -> list[Any]:
    """Every static split of the dynamic configuration's GPUs that fits in memory."""
    from dynsched_sim._plan import memory_problem
    from dynsched_sim._scenario import Configuration

    total, g = _dynamic(sc).total_gpus, sc.engine.gpus_per_replica
    out = []
    for t in range(g, total, g):
        if memory_problem(sc, t, total - t, False):
            continue
        out.append(
            Configuration(name=f"static-{t}-{total - t}", trainer_gpus=t, rollout_gpus=total - t)
        )
    return out


def _planning_scenario(sc: Any) -> Any:
    """The scenario the plan is made on: its workload seeds shifted off the evaluation
    seeds (`PLAN_SEED_SHIFT`)."""
    import attrs

    return attrs.evolve(sc, seed=sc.seed + PLAN_SEED_SHIFT)


def _make_plan(key: str, quick: bool) -> dict[str, Any]:
    """Plan the scenario's dynamic GPU budget on the planning seeds; the pick as JSON."""
    from dynsched_sim._plan import plan

    sc = _scenario(key)
    dyn = _dynamic(sc)
    p = plan(
        _planning_scenario(sc),
        gpus=dyn.total_gpus,
        seeds=1 if quick else PLAN_SEEDS,
        shortlist=PLAN_SHORTLIST,
    )
    pick = _pick_json(sc, p.best.candidate)
    return {
        "candidate": pick.pop("candidate"),
        "planning_seeds": list(p.seeds),
        "planned_time_s": p.best.time_s.mean,
        "staleness_bound": p.staleness_bound,
        "simulated_candidates": len(p.ranked),
        "seconds": p.seconds,
        **pick,
    }


def _default_candidate(sc: Any) -> Any:
    """The scenario's ``default`` configuration as a plan `Candidate`."""
    from dynsched_sim._plan import Candidate

    dyn = _dynamic(sc)
    base = sc.schedule_config(dyn)
    return Candidate(
        trainer_gpus=dyn.trainer_gpus,
        rollout_gpus=dyn.rollout_gpus,
        hybrid=True,
        policy="default",
        concurrency=base.concurrent_samples_per_replica,
        staleness_threshold=float(base.staleness_threshold),
    )


def _make_stale_plan(key: str, quick: bool, unconstrained: dict[str, Any]) -> dict[str, Any]:
    """Plan as `_make_plan`, with the simulated mean staleness of the pick on the planning
    seeds bounded by ``default``'s on the same seeds (module doc); the pick as JSON, with
    whether it differs from the ``unconstrained`` plan's pick."""
    from dynsched_sim import run_configuration
    from dynsched_sim._plan import PlanError, plan

    start = time.perf_counter()
    sc = _scenario(key)
    dyn, psc = _dynamic(sc), _planning_scenario(sc)
    n = 1 if quick else PLAN_SEEDS
    seeds = list(range(psc.seed, psc.seed + n))  # the seeds plan() simulates
    runs = [run_configuration(psc, dyn, "default", seed=s) for s in seeds]
    # the same mean as plan()'s PlannedCandidate.simulated_staleness
    bound = sum(r.staleness.get("mean", 0.0) for r in runs) / len(runs)
    fallback = ""
    try:
        p = plan(
            psc,
            gpus=dyn.total_gpus,
            seeds=n,
            shortlist=PLAN_SHORTLIST,
            simulated_staleness_bound=bound,
        )
        cand, planned_s = p.best.candidate, p.best.time_s.mean
        planned_stale = p.best.simulated_staleness
        simulated, over = len(p.ranked), sum(r.simulated_staleness > bound + 1e-9 for r in p.ranked)
        if list(p.seeds) != seeds:
            raise AssertionError(f"{key}: plan seeds {p.seeds} != {seeds}")
    except PlanError as e:
        if "simulated_staleness_bound" not in str(e):
            raise
        fallback = str(e)
        cand = _default_candidate(sc)
        planned_s = sum(r.wall_clock_s for r in runs) / len(runs)
        planned_stale, simulated, over = bound, 0, 0
    free = unconstrained["candidate"]["name"]
    return {
        **_pick_json(sc, cand),
        "planning_seeds": seeds,
        "planned_time_s": planned_s,
        "planned_simulated_staleness": planned_stale,
        "simulated_staleness_bound": bound,
        "default_planning_time_s": sum(r.wall_clock_s for r in runs) / len(runs),
        "simulated_candidates": simulated,
        "simulated_over_bound": over,
        "fallback": fallback,
        "unconstrained_pick": free,
        "changed": cand.name != free,
        "seconds": time.perf_counter() - start,
    }


def _pick_json(sc: Any, c: Any) -> dict[str, Any]:
    """A pick: the candidate, the scenario's dynamic configuration, how they differ."""
    dyn = _dynamic(sc)
    base = sc.schedule_config(dyn)
    notes = []
    if c.trainer_gpus + c.rollout_gpus != dyn.total_gpus:
        notes.append(f"GPUs {c.trainer_gpus + c.rollout_gpus} != dynamic {dyn.total_gpus}")
    if c.staleness_threshold != float(base.staleness_threshold):
        notes.append(
            f"staleness threshold {c.staleness_threshold:g} != dynamic's "
            f"{float(base.staleness_threshold):g}"
        )
    if c.concurrency != base.concurrent_samples_per_replica:
        notes.append(
            f"concurrency {c.concurrency} != dynamic's {base.concurrent_samples_per_replica}"
        )
    if not c.hybrid:
        notes.append("static split (no lending)")
    return {
        "candidate": c.to_json(),
        "dynamic": {
            "configuration": dyn.name,
            "trainer_gpus": dyn.trainer_gpus,
            "rollout_gpus": dyn.rollout_gpus,
            "concurrency": base.concurrent_samples_per_replica,
            "staleness_threshold": float(base.staleness_threshold),
        },
        "differs": notes,
    }


def _candidate(pick: dict[str, Any]) -> Any:
    import attrs
    from dynsched_sim._plan import Candidate

    c = pick["candidate"]
    return Candidate(**{k: c[k] for k in attrs.fields_dict(Candidate)})


def _resolve(task: tuple[Any, ...]) -> tuple[Any, Any, str, str | None, str]:
    """A task's scenario, configuration, policy, arm (None: not a plan arm) and
    configuration name."""
    key, conf_name, policy, _planner, _seed = task
    sc = _scenario(key)
    arm = None
    if conf_name in (*PLAN_ARMS, *STALE_ARMS):
        arm, cand = conf_name, _candidate(policy)
        sc, conf, policy = cand.scenario_for(sc), cand.configuration(), cand.policy
        conf_name = conf.name
    elif conf_name == STATIC_AT_PLAN:
        arm, (pick, conf_name) = conf_name, policy
        sc = _candidate(pick).scenario_for(sc)
        conf, policy = next(c for c in _static_splits(sc) if c.name == conf_name), STATIC_POLICY
    else:
        confs = {c.name: c for c in (*sc.configurations, *_static_splits(sc))}
        conf = confs[conf_name]
    return sc, conf, policy, arm, conf_name


def _one(task: tuple[Any, ...]) -> dict[str, Any]:
    """One simulated run: ``(scenario key, configuration name, policy, planner, seed)``, or
    for a plan arm ``(scenario key, arm, plan pick, planner, seed)``."""
    from dynsched_sim import run_configuration

    key, _conf, _policy, planner, seed = task
    sc, conf, policy, arm, conf_name = _resolve(task)
    r = run_configuration(sc, conf, policy, seed=seed, planner=planner)
    return {
        "key": key,
        **({"arm": arm} if arm else {}),
        "configuration": conf_name,
        "policy": r.policy,
        "seed": seed,
        "wall_clock_s": r.wall_clock_s,
        "efficiency": r.efficiency,
        "staleness_mean": r.staleness.get("mean", float("nan")),
        "role_moves": r.summary.get("role_moves", 0),
        "final_trainer_gpus": r.summary.get("final_trainer_gpus"),
        "conserved": all(r.conservation.values()),
    }


STATIC_POLICY = "static_fully_async"


def _plan_tasks(key: str, pick: dict[str, Any], seeds: list[int]) -> list[tuple[Any, ...]]:
    """The plan arms' runs of one scenario: the pick with and without the role planner,
    and (where the pick's concurrency or threshold differs from the scenario's) every
    static split at the pick's concurrency and threshold."""
    overlap = set(seeds) & set(pick["planning_seeds"])
    if overlap:
        raise ValueError(f"{key}: planning seeds overlap evaluation seeds {sorted(overlap)}")
    out = [(key, arm, pick, arm.endswith("+planner"), s) for s in seeds for arm in PLAN_ARMS]
    c, dyn = pick["candidate"], pick["dynamic"]
    if (c["concurrency"], c["staleness_threshold"]) != (
        dyn["concurrency"],
        dyn["staleness_threshold"],
    ):
        sc = _candidate(pick).scenario_for(_scenario(key))
        for conf in _static_splits(sc):
            try:
                sc.schedule_config(conf, STATIC_POLICY)
            except ValueError:
                continue  # the core refuses this split at the pick's knobs
            out += [(key, STATIC_AT_PLAN, (pick, conf.name), False, s) for s in seeds]
    return out


def _stale_tasks(key: str, pick: dict[str, Any], seeds: list[int]) -> list[tuple[Any, ...]]:
    """The staleness-constrained arms' runs of one scenario: the pick of the plan bounded
    by ``default``'s simulated staleness, with and without the role planner."""
    overlap = set(seeds) & set(pick["planning_seeds"])
    if overlap:
        raise ValueError(f"{key}: planning seeds overlap evaluation seeds {sorted(overlap)}")
    return [(key, arm, pick, "+planner" in arm, s) for s in seeds for arm in STALE_ARMS]


def _replan(key: str, quick: bool, plans: dict[str, Any], stale_plans: dict[str, Any]) -> set[str]:
    """Make ``key``'s two plans again (``plans``, ``stale_plans``: the cached ones, updated
    in place where a pick changed) and return the arms whose runs no longer belong to the
    pick: the plan arms (and ``static@plan`` where the pick's concurrency or threshold
    changed), the staleness-bounded arms. A plan whose pick is the same is kept as cached."""
    drop: set[str] = set()
    old, new = plans[key], _make_plan(key, quick)
    if new["candidate"]["name"] != old["candidate"]["name"]:
        plans[key] = new
        drop |= set(PLAN_ARMS)
        knobs = ("concurrency", "staleness_threshold")
        if any(new["candidate"][k] != old["candidate"][k] for k in knobs):
            drop.add(STATIC_AT_PLAN)
    stale = _make_stale_plan(key, quick, plans[key])
    if stale["candidate"]["name"] != stale_plans[key]["candidate"]["name"]:
        stale_plans[key] = stale
        drop |= set(STALE_ARMS)
    else:  # the same bounded pick; its comparison with the unconstrained one may not be
        free = plans[key]["candidate"]["name"]
        stale_plans[key]["unconstrained_pick"] = free
        stale_plans[key]["changed"] = stale_plans[key]["candidate"]["name"] != free
    if drop:
        print(f"{key}: re-planned, runs of {sorted(drop)} made again", file=sys.stderr)
    return drop


def _task_id(task: tuple[Any, ...]) -> tuple[Any, ...]:
    """A plan-arm task as ``(arm, configuration, seed)``, as `_row_id` names its run."""
    _key, arm, what, _planner, seed = task
    if arm == STATIC_AT_PLAN:
        return (arm, what[1], seed)
    return (arm, _candidate(what).split, seed)


def _row_id(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row.get("arm"), row["configuration"], row["seed"])


def _tasks(key: str, seeds: list[int]) -> list[tuple[str, str, str, bool, int]]:
    sc = _scenario(key)
    dyn = _dynamic(sc).name
    out = []
    for s in seeds:
        out.append((key, dyn, "default", False, s))
        out.append((key, dyn, "default", True, s))
        out += [(key, c.name, "static_fully_async", False, s) for c in _static_splits(sc)]
    return out


def _geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _inside(arm: list[float], default: list[float]) -> bool:
    """Whether an arm's mean staleness is at or below ``default``'s, counting a
    difference inside the seed spread as none: the arm's mean over the seeds is at most
    the largest of ``default``'s per-seed means on the same seeds (``arm``, ``default``:
    the per-seed mean staleness; the rule the sim README states for this target)."""
    return sum(arm) / len(arm) <= max(default) + 1e-9


def _summarise(
    key: str, rows: list[dict[str, Any]], stale: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One scenario: planner vs default vs the best static split, with seed spread.

    ``stale``: the scenario's ``plan@default-staleness`` plan; with it the derived arm
    `OR_DEFAULT` (its runs or ``default``'s, by their times on the planning seeds)."""
    seeds = sorted({r["seed"] for r in rows})
    plan_rows = [r for r in rows if r.get("arm")]
    if stale is not None:
        keep = stale["planned_time_s"] <= stale["default_planning_time_s"]
        plan_rows += [
            {**r, "arm": OR_DEFAULT}
            for r in rows
            if (
                r.get("arm") == STALE_ARMS[0]
                if keep
                else (not r.get("arm") and r["policy"] == "default")
            )
        ]
    rows = [r for r in rows if not r.get("arm")]

    def arm(pred: Any) -> dict[int, dict[str, Any]]:
        return {r["seed"]: r for r in rows if pred(r)}

    default = arm(lambda r: r["policy"] == "default")
    planner = arm(lambda r: r["policy"].endswith("+planner"))
    statics: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        if r["policy"] == "static_fully_async":
            statics.setdefault(r["configuration"], {})[r["seed"]] = r

    def mean(d: dict[int, dict[str, Any]], f: str = "wall_clock_s") -> float:
        return sum(d[s][f] for s in seeds) / len(seeds)

    best = min(statics, key=lambda c: mean(statics[c]))
    vs_static = [planner[s]["wall_clock_s"] / statics[best][s]["wall_clock_s"] for s in seeds]
    vs_default = [planner[s]["wall_clock_s"] / default[s]["wall_clock_s"] for s in seeds]
    spread = max(vs_static) - min(vs_static)
    ratio = mean(planner) / mean(statics[best])
    extra: dict[str, Any] = {}
    tuned: dict[str, dict[int, dict[str, Any]]] = {}
    for r in plan_rows:
        if r["arm"] == STATIC_AT_PLAN:
            tuned.setdefault(r["configuration"], {})[r["seed"]] = r
    tuned = {c: d for c, d in tuned.items() if set(d) == set(seeds)}
    best_t = min(tuned, key=lambda c: mean(tuned[c])) if tuned else None
    if any(r["arm"] in (*PLAN_ARMS, *STALE_ARMS, OR_DEFAULT) for r in plan_rows):
        # the best of the statics at the pick's knobs and at the scenario's own
        t_d, label = statics[best], f"{best} at the scenario's knobs"
        if best_t is not None and mean(tuned[best_t]) < mean(t_d):
            t_d, label = tuned[best_t], f"{best_t} at the plan's knobs"
        extra.update(
            {
                "best_tuned_static": label,
                "best_tuned_static_s": mean(t_d),
                "statics_at_plan_knobs_s": {c: mean(d) for c, d in tuned.items()},
            }
        )
    for name in (*PLAN_ARMS, *STALE_ARMS, OR_DEFAULT):
        got = {r["seed"]: r for r in plan_rows if r["arm"] == name}
        if set(got) != set(seeds):
            continue
        f = _field(name)
        vs_s = [got[s]["wall_clock_s"] / statics[best][s]["wall_clock_s"] for s in seeds]
        vs_d = [got[s]["wall_clock_s"] / default[s]["wall_clock_s"] for s in seeds]
        r_s = mean(got) / mean(statics[best])
        extra.update(
            {
                f"{f}_s": mean(got),
                f"{f}_vs_best_static": r_s,
                f"{f}_vs_best_static_seed_range": [min(vs_s), max(vs_s)],
                f"{f}_vs_default": mean(got) / mean(default),
                f"{f}_vs_default_seed_range": [min(vs_d), max(vs_d)],
                f"{f}_within_1pct_of_best_static": r_s <= 1.01
                or r_s - 1.0 <= max(vs_s) - min(vs_s),
                f"{f}_efficiency_min": min(got[s]["efficiency"] for s in seeds),
                f"{f}_efficiency_mean": mean(got, "efficiency"),
                f"{f}_moves": [got[s]["role_moves"] for s in seeds],
                f"{f}_final_trainer_gpus": [got[s]["final_trainer_gpus"] for s in seeds],
                f"staleness_{f}": mean(got, "staleness_mean"),
                f"{f}_staleness_at_or_below_default_within_spread": _inside(
                    [got[s]["staleness_mean"] for s in seeds],
                    [default[s]["staleness_mean"] for s in seeds],
                ),
                f"{f}_conserved": all(got[s]["conserved"] for s in seeds),
            }
        )
        vs_t = [got[s]["wall_clock_s"] / t_d[s]["wall_clock_s"] for s in seeds]
        r_t = mean(got) / mean(t_d)
        extra.update(
            {
                f"{f}_vs_best_tuned_static": r_t,
                f"{f}_vs_best_tuned_static_seed_range": [min(vs_t), max(vs_t)],
                f"{f}_within_1pct_of_best_tuned_static": r_t <= 1.01
                or r_t - 1.0 <= max(vs_t) - min(vs_t),
            }
        )
    return {
        "scenario": key,
        "seeds": seeds,
        "default_s": mean(default),
        "planner_s": mean(planner),
        "best_static": best,
        "best_static_s": mean(statics[best]),
        "statics_s": {c: mean(d) for c, d in statics.items()},
        "planner_vs_best_static": ratio,
        "planner_vs_best_static_seed_range": [min(vs_static), max(vs_static)],
        "planner_vs_default": mean(planner) / mean(default),
        "planner_vs_default_seed_range": [min(vs_default), max(vs_default)],
        "default_vs_best_static": mean(default) / mean(statics[best]),
        "within_1pct_of_best_static": ratio <= 1.01 or ratio - 1.0 <= spread,
        "planner_efficiency_min": min(planner[s]["efficiency"] for s in seeds),
        "planner_moves": [planner[s]["role_moves"] for s in seeds],
        "planner_final_trainer_gpus": [planner[s]["final_trainer_gpus"] for s in seeds],
        "staleness_planner": mean(planner, "staleness_mean"),
        "staleness_default": mean(default, "staleness_mean"),
        "planner_staleness_at_or_below_default_within_spread": _inside(
            [planner[s]["staleness_mean"] for s in seeds],
            [default[s]["staleness_mean"] for s in seeds],
        ),
        "all_conserved": all(r["conserved"] for r in rows),
        **extra,
    }


def _plan_family(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The plan arms' family figures, over the scenarios that have them."""
    out: dict[str, Any] = {}
    for name in (*PLAN_ARMS, *STALE_ARMS, OR_DEFAULT):
        f = _field(name)
        got = [s for s in summaries if f"{f}_s" in s]
        if not got:
            continue
        out.update(
            {
                f"{f}_scenarios": len(got),
                f"geomean_{f}_vs_default": _geomean(s[f"{f}_vs_default"] for s in got),
                f"geomean_{f}_vs_best_static": _geomean(s[f"{f}_vs_best_static"] for s in got),
                f"{f}_within_1pct_of_best_static": sum(
                    s[f"{f}_within_1pct_of_best_static"] for s in got
                ),
                f"min_{f}_efficiency": min(s[f"{f}_efficiency_min"] for s in got),
                f"mean_{f}_efficiency": sum(s[f"{f}_efficiency_mean"] for s in got) / len(got),
                f"{f}_staleness_at_or_below_default": sum(
                    s[f"staleness_{f}"] <= s["staleness_default"] + 1e-9 for s in got
                ),
                f"{f}_staleness_at_or_below_default_within_spread": sum(
                    s[f"{f}_staleness_at_or_below_default_within_spread"] for s in got
                ),
                f"{f}_all_conserved": all(s[f"{f}_conserved"] for s in got),
                f"geomean_{f}_vs_best_tuned_static": _geomean(
                    s[f"{f}_vs_best_tuned_static"] for s in got
                ),
                f"{f}_within_1pct_of_best_tuned_static": sum(
                    s[f"{f}_within_1pct_of_best_tuned_static"] for s in got
                ),
            }
        )
    notes = [s["stale_plan"] for s in summaries if "stale_plan" in s]
    if notes:
        out.update(
            {
                "stale_plans": len(notes),
                "stale_plan_changed_picks": sum(n["changed"] for n in notes),
                "stale_plan_fallbacks": sum(bool(n["fallback"]) for n in notes),
                "stale_plan_slower_than_default_on_planning_seeds": sum(
                    n["planned_time_s"] > n["default_planning_time_s"] for n in notes
                ),
                "stale_plan_within_bound_on_planning_seeds": sum(
                    n["planned_simulated_staleness"] <= n["simulated_staleness_bound"] + 1e-9
                    for n in notes
                ),
                "stale_plan_seconds": sum(n["seconds"] for n in notes),
            }
        )
    return out


def _family(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "scenarios": len(summaries),
        "geomean_planner_vs_default": _geomean(s["planner_vs_default"] for s in summaries),
        "geomean_planner_vs_best_static": _geomean(s["planner_vs_best_static"] for s in summaries),
        "geomean_default_vs_best_static": _geomean(s["default_vs_best_static"] for s in summaries),
        "within_1pct_of_best_static": sum(s["within_1pct_of_best_static"] for s in summaries),
        "min_planner_efficiency": min(s["planner_efficiency_min"] for s in summaries),
        "staleness_at_or_below_default": sum(
            s["staleness_planner"] <= s["staleness_default"] + 1e-9 for s in summaries
        ),
        "staleness_at_or_below_default_within_spread": sum(
            s["planner_staleness_at_or_below_default_within_spread"] for s in summaries
        ),
        **_plan_family(summaries),
    }


def _keys(family: str, quick: bool) -> tuple[list[str], int]:
    """Scenario keys of a family and seeds per scenario."""
    from dynsched_sim import builtin_scenarios

    if family == "builtin":
        return list(builtin_scenarios()), 2 if quick else 5
    n = 5 if quick else 20
    return [f"draw:{FIRST[family] + i}" for i in range(n)], 1 if quick else 3


def _seeds(key: str, k: int) -> list[int]:
    base = _scenario(key).seed
    return [base + i for i in range(k)]


def _table(family: str, summaries: list[dict[str, Any]], fam: dict[str, Any]) -> str:
    lines = [
        f"== {family}: planner (default+planner) vs default vs best static split ==",
        f"{'scenario':<24}{'default':>9}{'planner':>9}{'best static':>20}{'pl/best':>9}"
        f"{'seed range':>16}{'pl/def':>8}{'moves':>10}{'eff':>6}{'stale pl/def':>14}",
    ]
    for s in summaries:
        lo, hi = s["planner_vs_best_static_seed_range"]
        lines.append(
            f"{s['scenario']:<24}{s['default_s']:>9.0f}{s['planner_s']:>9.0f}"
            f"{s['best_static'] + ' ' + format(s['best_static_s'], '.0f'):>20}"
            f"{s['planner_vs_best_static']:>9.3f}{f'{lo:.3f}-{hi:.3f}':>16}"
            f"{s['planner_vs_default']:>8.3f}{','.join(map(str, s['planner_moves'])):>10}"
            f"{s['planner_efficiency_min']:>6.2f}"
            f"{format(s['staleness_planner'], '.2f') + '/' + format(s['staleness_default'], '.2f'):>14}"
        )
    lines.append(
        f"geomean planner/default {fam['geomean_planner_vs_default']:.3f}, planner/best static "
        f"{fam['geomean_planner_vs_best_static']:.3f} (default/best static "
        f"{fam['geomean_default_vs_best_static']:.3f}); within 1% of best static "
        f"{fam['within_1pct_of_best_static']}/{fam['scenarios']}; min efficiency "
        f"{fam['min_planner_efficiency']:.2f}; staleness <= default "
        f"{fam['staleness_at_or_below_default']}/{fam['scenarios']}"
        f"{_spread_note(fam, 'staleness_at_or_below_default', fam['scenarios'])}"
    )
    return "\n".join(lines)


def _instrument() -> str:
    """The simulator these runs measure: the checkout's commit (``+dirty`` with local edits
    to the packages or this script)."""
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", *a], cwd=Path(__file__).parent, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # not the results being written; ``:/``: from the top of the work tree (git runs in
    # benchmarks/, where a plain ``packages`` names nothing and nothing read as dirty)
    code = (":/packages", ":/benchmarks/sim_planner.py")
    dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no", "--", *code) else ""
    return f"simulator of commit {commit}{dirty}"


def _write(path: Path | None, result: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)


def _spread_note(fam: dict[str, Any], field: str, n: int) -> str:
    """`` (k/n with differences inside the seed spread as none)`` after a staleness
    count, where the result recorded the count by `_inside` (older files did not)."""
    k = fam.get(field + "_within_spread")
    return "" if k is None else f" ({k}/{n} with differences inside the seed spread as none)"


def _plan_table(family: str, summaries: list[dict[str, Any]], fam: dict[str, Any]) -> str:
    """The plan arms: the pick, plan and plan+planner against default and the best static."""
    lines = [
        f"== {family}: plan / plan+planner (the plan's pick, planning seeds disjoint) ==",
        f"{'scenario':<24}{'pick':>34}{'default':>9}{'plan':>9}{'plan+pl':>9}{'best st':>9}"
        f"{'p+p/best':>9}{'p+p/def':>9}{'p/best':>8}{'p+p/tuned':>10}{'eff':>6}"
        f"{'stale p+p/def':>15}",
    ]
    for s in summaries:
        if "plan_planner_s" not in s or "plan_s" not in s:
            continue
        pick = s["plan"]["pick"]
        lines.append(
            f"{s['scenario']:<24}{pick:>34}{s['default_s']:>9.0f}{s['plan_s']:>9.0f}"
            f"{s['plan_planner_s']:>9.0f}{s['best_static_s']:>9.0f}"
            f"{s['plan_planner_vs_best_static']:>9.3f}{s['plan_planner_vs_default']:>9.3f}"
            f"{s['plan_vs_best_static']:>8.3f}{s['plan_planner_vs_best_tuned_static']:>10.3f}"
            f"{s['plan_planner_efficiency_min']:>6.2f}"
            f"{format(s['staleness_plan_planner'], '.2f') + '/' + format(s['staleness_default'], '.2f'):>15}"
        )
    if "plan_planner_scenarios" in fam:
        n = fam["plan_planner_scenarios"]
        lines.append(
            f"geomean plan+planner/default {fam['geomean_plan_planner_vs_default']:.3f}, "
            f"/best static {fam['geomean_plan_planner_vs_best_static']:.3f}; plan/default "
            f"{fam['geomean_plan_vs_default']:.3f}, /best static "
            f"{fam['geomean_plan_vs_best_static']:.3f}; within 1% of best static: plan+planner "
            f"{fam['plan_planner_within_1pct_of_best_static']}/{n}, plan "
            f"{fam['plan_within_1pct_of_best_static']}/{fam['plan_scenarios']}; plan+planner / "
            f"best tuned static {fam['geomean_plan_planner_vs_best_tuned_static']:.3f} (within "
            f"1%: {fam['plan_planner_within_1pct_of_best_tuned_static']}/{n}); min efficiency "
            f"{fam['min_plan_planner_efficiency']:.2f}; staleness <= default "
            f"{fam['plan_planner_staleness_at_or_below_default']}/{n}"
            f"{_spread_note(fam, 'plan_planner_staleness_at_or_below_default', n)}"
        )
    return "\n".join(lines)


def _stale_table(family: str, summaries: list[dict[str, Any]], fam: dict[str, Any]) -> str:
    """The staleness-constrained arms against default and the best static split."""
    f, g = _field(STALE_ARMS[0]), _field(STALE_ARMS[1])
    lines = [
        f"== {family}: plan@default-staleness (simulated staleness <= default's on the "
        "planning seeds) ==",
        f"{'scenario':<24}{'pick':>34}{'chg':>4}{'bound':>7}{'pick st':>8}{'default':>9}"
        f"{'p@ds':>9}{'p+p@ds':>9}{'best st':>9}{'p/def':>7}{'p/best':>8}{'p+p/def':>8}"
        f"{'stale p/def':>13}",
    ]
    for s in summaries:
        if f"{f}_s" not in s or f"{g}_s" not in s:
            continue
        n = s["stale_plan"]
        lines.append(
            f"{s['scenario']:<24}{n['pick']:>34}{'y' if n['changed'] else '-':>4}"
            f"{n['simulated_staleness_bound']:>7.3f}{n['planned_simulated_staleness']:>8.3f}"
            f"{s['default_s']:>9.0f}{s[f + '_s']:>9.0f}{s[g + '_s']:>9.0f}"
            f"{s['best_static_s']:>9.0f}{s[f + '_vs_default']:>7.3f}"
            f"{s[f + '_vs_best_static']:>8.3f}{s[g + '_vs_default']:>8.3f}"
            f"{format(s['staleness_' + f], '.3f') + '/' + format(s['staleness_default'], '.3f'):>13}"
        )
    if f"{f}_scenarios" in fam:
        n = fam[f"{f}_scenarios"]
        lines.append(
            f"geomean plan@ds/default {fam[f'geomean_{f}_vs_default']:.3f}, /best static "
            f"{fam[f'geomean_{f}_vs_best_static']:.3f}; plan+planner@ds/default "
            f"{fam[f'geomean_{g}_vs_default']:.3f}, /best static "
            f"{fam[f'geomean_{g}_vs_best_static']:.3f}; within 1% of best static: plan@ds "
            f"{fam[f'{f}_within_1pct_of_best_static']}/{n}, plan+planner@ds "
            f"{fam[f'{g}_within_1pct_of_best_static']}/{n}; staleness <= default: plan@ds "
            f"{fam[f'{f}_staleness_at_or_below_default']}/{n}"
            f"{_spread_note(fam, f'{f}_staleness_at_or_below_default', n)}, plan+planner@ds "
            f"{fam[f'{g}_staleness_at_or_below_default']}/{n}"
            f"{_spread_note(fam, f'{g}_staleness_at_or_below_default', n)}; picks changed by "
            "the bound "
            f"{fam['stale_plan_changed_picks']}/{fam['stale_plans']} (fallbacks "
            f"{fam['stale_plan_fallbacks']}); min efficiency {fam[f'min_{f}_efficiency']:.2f}"
        )
    o = _field(OR_DEFAULT)
    if f"{o}_scenarios" in fam:
        n = fam[f"{o}_scenarios"]
        lines.append(
            f"{OR_DEFAULT} (default kept where the pick was slower on the planning seeds: "
            f"{fam['stale_plan_slower_than_default_on_planning_seeds']}/{fam['stale_plans']}): "
            f"/default {fam[f'geomean_{o}_vs_default']:.3f}, /best static "
            f"{fam[f'geomean_{o}_vs_best_static']:.3f}; within 1% of best static "
            f"{fam[f'{o}_within_1pct_of_best_static']}/{n}; staleness <= default "
            f"{fam[f'{o}_staleness_at_or_below_default']}/{n}"
            f"{_spread_note(fam, f'{o}_staleness_at_or_below_default', n)}"
        )
    return "\n".join(lines)


def _plan_settings(quick: bool) -> dict[str, Any]:
    return {
        "seed_shift": PLAN_SEED_SHIFT,
        "seeds": 1 if quick else PLAN_SEEDS,
        "shortlist": PLAN_SHORTLIST,
        "gpus": "the dynamic configuration's total",
        "staleness_bound": "the scenario's staleness_threshold (plan's default)",
        # plans made before every plan ranked it are not reused
        "own_configuration": "simulated on the planning seeds and ranked (plan's default)",
    }


def _stale_plan_settings(quick: bool) -> dict[str, Any]:
    return {
        **_plan_settings(quick),
        "simulated_staleness_bound": "the mean staleness of the scenario's default "
        "configuration simulated on the planning seeds (plan's simulated_staleness_bound)",
    }


def _stale_note(pick: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    return {
        **_plan_note(pick, seeds),
        **{
            k: pick[k]
            for k in (
                "simulated_staleness_bound",
                "planned_simulated_staleness",
                "default_planning_time_s",
                "simulated_candidates",
                "simulated_over_bound",
                "unconstrained_pick",
                "changed",
                "fallback",
            )
        },
    }


def _plan_note(pick: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    c = pick["candidate"]
    return {
        "pick": f"{c['name']}",
        "planning_seeds": pick["planning_seeds"],
        "evaluation_seeds": seeds,
        "planned_time_s": pick["planned_time_s"],
        "seconds": pick["seconds"],
        "differs": pick["differs"],
    }


def run(
    families: list[str],
    quick: bool,
    jobs: int,
    *,
    progress: Any = None,
    until: float | None = None,
    plan_arms: bool = True,
    plan_only: bool = False,
    replan: bool = False,
    existing: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the families; after every scenario ``progress(result, family)`` is called with
    the partial result (main writes it out). A family that ends early (``until``: a
    wall-clock time after which no scenario is started that the running estimate says
    would not finish) is marked ``complete: false``; its summary covers the scenarios that
    finished.

    ``plan_arms``: also the ``plan`` and ``plan+planner`` arms. ``existing``: per family,
    a previous result's entry; its ``plans`` are reused (same plan settings), and with
    ``plan_only`` its runs of the other arms are kept and only the plan arms are run (a
    scenario the deadline cuts keeps its other arms' summary, without the plan arms).
    ``replan`` (with ``plan_only``): every cached plan is made again; where the pick changed
    (after a change of the plan or its bound), the new plan replaces it and the runs of the
    arms it feeds are dropped and run again (`_replan`)."""
    existing = existing or {}
    plan_arms = plan_arms or plan_only
    result: dict[str, Any] = {"instrument": _instrument(), "quick": quick, "families": {}}
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    try:
        for family in families:
            keys, k = _keys(family, quick)
            old = existing.get(family, {})
            settings = _plan_settings(quick)
            plans: dict[str, Any] = (
                dict(old.get("plans", {})) if (old.get("plan_settings") == settings) else {}
            )
            stale_settings = _stale_plan_settings(quick)
            stale_plans: dict[str, Any] = (
                dict(old.get("stale_plans", {}))
                if plans and old.get("stale_plan_settings") == stale_settings
                else {}
            )
            old_rows: dict[str, list[dict[str, Any]]] = {}
            kept: list[dict[str, Any]] = []  # in the file's order
            if plan_only:
                if not old.get("runs"):
                    raise ValueError(f"--plan-only: no existing runs of family {family}")
                for r in old["runs"]:
                    arm = r.get("arm")
                    # plan-arm runs kept with their plans
                    if not arm or (stale_plans if arm in STALE_ARMS else plans):
                        old_rows.setdefault(r["key"], []).append(r)
                        kept.append(r)
                keys = [key for key in keys if key in old_rows]
            seeds_of = {key: _seeds(key, k) for key in keys}
            per_key = {key: [] if plan_only else _tasks(key, seeds_of[key]) for key in keys}
            total = sum(len(t) for t in per_key.values())
            t0 = time.perf_counter()
            print(f"{family}: {len(keys)} scenarios, {total} runs", file=sys.stderr, flush=True)
            rows: list[dict[str, Any]] = []
            summaries: list[dict[str, Any]] = []
            entry: dict[str, Any] = {"complete": False, "scenarios_planned": len(keys)}
            history: list[dict[str, Any]] = []
            made = {"plans": 0, "stale_plans": 0}
            if plan_only:
                entry.update({n: v for n, v in old.items() if n not in ("plans", "stale_plans")})
                entry["complete"] = False
                # the instrument of runs kept from the file stays theirs; this run's is in
                # plan_only_runs
                if not (plans and old.get("plan_arms_instrument")):
                    entry["plan_arms_instrument"] = result["instrument"]
                if not stale_plans:
                    entry["stale_plan_arms_instrument"] = result["instrument"]
                history = list(old.get("plan_only_runs", []))
            if plan_arms:
                entry["plan_settings"] = settings
                entry["plans"] = plans
                entry["stale_plan_settings"] = stale_settings
                entry["stale_plans"] = stale_plans
            result["families"][family] = entry
            stopped, done_keys = False, 0
            for i, key in enumerate(keys):
                if until is not None and done_keys and not stopped:
                    el = time.perf_counter() - t0
                    est = el / done_keys if plan_arms else el / len(rows) * len(per_key[key])
                    if time.time() + est > until:
                        print(f"{family}: stopping before {key} (deadline)", file=sys.stderr)
                        stopped = True
                if stopped and not plan_only:
                    break
                tasks = list(per_key[key])
                if replan and not stopped and key in plans and key in stale_plans:
                    drop = _replan(key, quick, plans, stale_plans)
                    made["replanned"] = made.get("replanned", 0) + bool(drop)
                    old_rows[key] = [r for r in old_rows.get(key, []) if r.get("arm") not in drop]
                    kept = [r for r in kept if r["key"] != key or r.get("arm") not in drop]
                if plan_arms and not stopped:
                    if key not in plans:
                        plans[key] = _make_plan(key, quick)
                        made["plans"] += 1
                    if key not in stale_plans:
                        made["stale_plans"] += 1
                        sp = stale_plans[key] = _make_stale_plan(key, quick, plans[key])
                        print(
                            f"{family}: {key} plan@default-staleness planned in "
                            f"{sp['seconds']:.0f} s: {sp['candidate']['name']} "
                            f"({'changed' if sp['changed'] else 'same pick'}; "
                            f"default's planning staleness {sp['simulated_staleness_bound']:.4f},"
                            f" pick's {sp['planned_simulated_staleness']:.4f}"
                            f"{'; fallback' if sp['fallback'] else ''})",
                            file=sys.stderr,
                            flush=True,
                        )
                    have = {_row_id(r) for r in old_rows.get(key, []) if r.get("arm")}
                    tasks += [
                        t
                        for t in _plan_tasks(key, plans[key], seeds_of[key])
                        + _stale_tasks(key, stale_plans[key], seeds_of[key])
                        if _task_id(t) not in have
                    ]
                got = list(pool.map(_one, tasks, chunksize=1)) if pool else [_one(t) for t in tasks]
                rows += got
                summary = _summarise(
                    key,
                    old_rows.get(key, []) + got,
                    stale_plans[key] if plan_arms and not stopped else None,
                )
                if plan_arms and not stopped:
                    summary["plan"] = _plan_note(plans[key], seeds_of[key])
                    summary["stale_plan"] = _stale_note(stale_plans[key], seeds_of[key])
                summaries.append(summary)
                if not stopped:
                    done_keys += 1
                el = time.perf_counter() - t0
                eta = el / done_keys * (len(keys) - i - 1)
                print(
                    f"{family}: {i + 1}/{len(keys)} {key} ({len(rows)} runs) "
                    f"{el:.0f} s, about {eta:.0f} s left",
                    file=sys.stderr,
                    flush=True,
                )
                all_rows = kept + rows
                entry.update(
                    summary=_family(summaries),
                    scenarios=summaries,
                    runs=all_rows if plan_only else rows,
                    complete=done_keys == len(keys),
                    **(
                        {"plan_wall_s": old.get("plan_wall_s", el)} if plan_only else {"wall_s": el}
                    ),
                )
                if plan_only:
                    this_run = {
                        "instrument": result["instrument"],
                        "wall_s": el,
                        "runs": len(rows),
                        "arms": sorted({r.get("arm") for r in rows if r.get("arm")}),
                        "plans_made": made,
                    }
                    entry["plan_only_runs"] = [*history, this_run]
                if progress is not None:
                    progress(result, family)
            print(
                f"{family}: done in {time.perf_counter() - t0:.0f} s ({len(rows)} runs, "
                f"plans made {made['plans']}, staleness-bounded plans made "
                f"{made['stale_plans']})",
                file=sys.stderr,
                flush=True,
            )
            if summaries:
                _print_tables(family, summaries, entry["summary"], plan_arms)
    finally:
        if pool:
            pool.shutdown()
    return result


def _print_tables(
    family: str, summaries: list[dict[str, Any]], fam: dict[str, Any], plan_arms: bool
) -> None:
    """A family's tables (with ``plan_arms``, the plan arms' two as well) to stdout."""
    print(_table(family, summaries, fam), flush=True)
    if plan_arms:
        print(_plan_table(family, summaries, fam), flush=True)
        print(_stale_table(family, summaries, fam), flush=True)


def _row_task(row: dict[str, Any], entry: dict[str, Any]) -> tuple[Any, ...]:
    """The task that made a stored run (``entry``: its family, for the plans)."""
    key, arm, seed = row["key"], row.get("arm"), row["seed"]
    planner = row["policy"].endswith("+planner")
    if arm in PLAN_ARMS:
        return (key, arm, entry["plans"][key], planner, seed)
    if arm in STALE_ARMS:
        return (key, arm, entry["stale_plans"][key], planner, seed)
    if arm == STATIC_AT_PLAN:
        return (key, arm, (entry["plans"][key], row["configuration"]), False, seed)
    return (key, row["configuration"], row["policy"].removesuffix("+planner"), planner, seed)


def _bound_of(task: tuple[Any, ...]) -> float:
    """The lower bound the run of ``task`` reports, without simulating it."""
    from dynsched_sim import run_lower_bound

    sc, conf, policy, _arm, _name = _resolve(task)
    return float(run_lower_bound(sc, conf, policy, seed=task[4], planner=task[3]).seconds)


def rebound(path: Path, jobs: int) -> dict[str, Any]:
    """Re-read every run of a result file against the current lower bound: each run's
    efficiency becomes ``run_lower_bound / wall_clock_s`` (the runs are not simulated
    again: the simulator is deterministic and the bound is computed after a run, from its
    workload draw, so only the bound changed) and the summaries are made anew. The
    file's ``bound_instrument`` names the commit of the bound."""
    data = json.loads(path.read_text())
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    try:
        for family, entry in data["families"].items():
            rows = entry["runs"]
            tasks = [_row_task(r, entry) for r in rows]
            bounds = (
                list(pool.map(_bound_of, tasks, chunksize=8))
                if pool
                else [_bound_of(t) for t in tasks]
            )
            moved = 0
            for r, b in zip(rows, bounds, strict=True):
                eff = b / r["wall_clock_s"] if r["wall_clock_s"] > 0 else 0.0
                moved += eff != r["efficiency"]
                r["efficiency"] = eff
            summaries = []
            for old in entry["scenarios"]:
                key = old["scenario"]
                stale = entry.get("stale_plans", {}).get(key)
                summary = _summarise(key, [r for r in rows if r["key"] == key], stale)
                for note in ("plan", "stale_plan"):
                    if note in old:
                        summary[note] = old[note]
                summaries.append(summary)
            entry.update(
                scenarios=summaries,
                summary=_family(summaries),
                bound_instrument=_instrument(),
                rebound={"runs": len(rows), "efficiencies_changed": moved},
            )
            print(
                f"{family}: {len(rows)} runs re-read against the current bound "
                f"({moved} efficiencies changed)",
                file=sys.stderr,
                flush=True,
            )
            _print_tables(family, summaries, entry["summary"], bool(entry.get("plans")))
    finally:
        if pool:
            pool.shutdown()
    return data


def _one_family(result: dict[str, Any], family: str) -> dict[str, Any]:
    """One family of the result, as written to its own file."""
    return {**result, "families": {family: result["families"][family]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer seeds and draws")
    ap.add_argument("--family", nargs="+", choices=ALL_FAMILIES, default=list(FAMILIES))
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--out", default=None, help="JSON file (default: benchmarks/results/...)")
    ap.add_argument(
        "--per-family",
        action="store_true",
        help="one file per family: sim_planner_FAMILY.json (sim_planner_quick_FAMILY.json "
        "with --quick), in --out's folder if given",
    )
    ap.add_argument(
        "--until",
        default=None,
        help="HH:MM (UTC): start no scenario expected to end after it; keep what finished",
    )
    arms = ap.add_mutually_exclusive_group()
    arms.add_argument("--no-plan", action="store_true", help="leave out the plan arms")
    arms.add_argument(
        "--plan-only",
        action="store_true",
        help="run only the plan arms and merge them into the existing result file(s)",
    )
    ap.add_argument(
        "--replan",
        action="store_true",
        help="with --plan-only: make every cached plan again and run again the arms of "
        "each pick that changed (after a change of the plan or of the lower bound)",
    )
    arms.add_argument(
        "--rebound",
        action="store_true",
        help="simulate nothing: re-read the runs of the existing result file(s) against "
        "the current lower bound (efficiencies and summaries) and rewrite them",
    )
    args = ap.parse_args(argv)
    stem = "sim_planner_quick" if args.quick else "sim_planner"
    if args.rebound:
        folder = Path(args.out) if args.out and args.per_family else RESULTS
        paths = (
            [folder / f"{stem}_{f}.json" for f in args.family]
            if args.per_family
            else [Path(args.out) if args.out else RESULTS / f"{stem}.json"]
        )
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            ap.error(f"--rebound: no result file to re-read: {', '.join(missing)}")
        for path in paths:
            _write(path, rebound(path, max(1, args.jobs)))
            print(f"wrote {path}")
        return 0

    def load(path: Path, families: list[str]) -> dict[str, dict[str, Any]]:
        """The families of an existing result file (plans reused; with --plan-only its
        runs kept), each noting the instrument its other arms were measured with."""
        if not path.exists():
            return {}
        old = json.loads(path.read_text())
        if old.get("quick") != args.quick:
            return {}
        return {
            f: {"other_arms_instrument": old.get("instrument"), **e}
            for f, e in old.get("families", {}).items()
            if f in families
        }

    if args.replan and not args.plan_only:
        ap.error("--replan goes with --plan-only (it re-makes the cached plans of a result file)")
    kw: dict[str, Any] = {
        "plan_arms": not args.no_plan,
        "plan_only": args.plan_only,
        "replan": args.replan,
    }
    until = None
    if args.until:
        import datetime as dt

        hh, mm = map(int, args.until.split(":"))
        now = dt.datetime.now(dt.UTC)
        end = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
        if end <= now:
            end += dt.timedelta(days=1)
        until = end.timestamp()
    if args.per_family:
        folder = Path(args.out) if args.out else RESULTS

        def out(family: str) -> Path:
            return folder / f"{stem}_{family}.json"

        def each(result: dict[str, Any], family: str) -> None:
            _write(out(family), _one_family(result, family))

        existing: dict[str, dict[str, Any]] = {}
        for family in args.family:
            existing.update(load(out(family), [family]))
        result = run(
            args.family,
            args.quick,
            max(1, args.jobs),
            progress=each,
            until=until,
            existing=existing,
            **kw,
        )
        for family in result["families"]:
            print(f"wrote {out(family)}")
        return 0
    path = Path(args.out) if args.out else RESULTS / f"{stem}.json"
    result = run(
        args.family,
        args.quick,
        max(1, args.jobs),
        progress=lambda r, _f: _write(path, r),
        until=until,
        existing=load(path, args.family),
        **kw,
    )
    _write(path, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
