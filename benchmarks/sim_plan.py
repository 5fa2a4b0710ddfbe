"""Check: `dynsched plan` against an exhaustive sweep, and its wall time at 32 and 1,024 GPUs.

1. ``seed-qwen35`` (32 GPUs): the plan (default settings: 3 seeds, shortlist 4) and its
   wall time; then an exhaustive sweep that simulates, over the same seeds, every
   candidate of the plan's candidate set within the staleness bound (every split x
   policy x concurrency x threshold), and the sweep of every split and policy at the
   scenario's own concurrency and threshold. Reports the relative difference of the
   plan's pick (its simulated mean) to the best of each sweep (target: within 1%).
2. A 1,024-GPU plan: ``large`` (256 GPUs, mini-batch 128) scaled by 4 (mini-batch 512, a
   budget of 1,024 GPUs), wall time on one core (target: <= 5 min; 32 GPUs: <= 60 s).

    OMP_NUM_THREADS=1 python benchmarks/sim_plan.py [--quick] [--out FILE]

``--quick``: skips the exhaustive sweep of the full candidate set (keeps the sweep of
splits). ``--timing-only``: only the two plans, wall and CPU time (on a shared machine the
CPU time is the one-core figure), to ``results/sim_plan_timing.json``. Writes
``benchmarks/results/sim_plan.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

DEFAULT_OUT = Path(__file__).parent / "results" / "sim_plan.json"


def _note(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _sweep(scenario: Any, p: Any, *, own_knobs: bool) -> list[Any]:
    """Simulate every feasible candidate of the plan's candidate set (``own_knobs``: only
    those at the scenario's concurrency and threshold) over the plan's seeds."""
    from dynsched_sim._plan import _assess, _candidates, _simulated

    cfg = scenario.schedule_config(scenario.configurations[0])
    own = (cfg.concurrent_samples_per_replica, float(cfg.staleness_threshold))
    done = []
    for cand, runs in _candidates(scenario, p.gpus, [*_policies()]):
        if own_knobs and (cand.concurrency, cand.staleness_threshold) != own:
            continue
        a = _assess(scenario, cand, runs, p.seeds[0], p.staleness_bound)
        for policy in runs if not a.problem else ():
            done.append(_simulated(scenario, a, policy, p.seeds))
            _note(f"sweep {len(done)}: {done[-1].candidate.name} {done[-1].time_s.mean:.0f} s")
    return sorted(done, key=lambda d: d.time_s.mean)


def _policies() -> tuple[str, ...]:
    from dynsched_sim._plan import DEFAULT_PLAN_POLICIES

    return DEFAULT_PLAN_POLICIES


def _row(d: Any) -> dict[str, Any]:
    return {"candidate": d.candidate.name, "time_s": d.time_s.to_json()}


def _timed(sc: Any, gpus: int | None = None) -> tuple[Any, float, float]:
    """The default plan, its wall time and its CPU time (one process, one thread)."""
    from dynsched_sim import plan

    wall, cpu = time.perf_counter(), time.process_time()
    p = plan(sc, gpus=gpus, progress=_note)
    return p, time.perf_counter() - wall, time.process_time() - cpu


def seed_part(quick: bool, timing_only: bool = False) -> dict[str, Any]:
    from dynsched_sim import load_scenario

    sc = load_scenario("seed-qwen35")
    p, wall, cpu = _timed(sc)
    pick = p.best
    out: dict[str, Any] = {
        "plan_wall_s": wall,
        "plan_cpu_s": cpu,
        "plan_pick": _row(pick),
        "simulated": len(p.ranked),
        "candidates": p.candidates,
    }
    for key, own in (("sweep_of_splits", True), ("sweep_of_candidate_set", False)):
        if timing_only or (quick and not own):
            continue
        swept = _sweep(sc, p, own_knobs=own)
        best = swept[0]
        out[key] = {
            "runs": len(swept),
            "best": _row(best),
            "pick_vs_best": pick.time_s.mean / best.time_s.mean - 1.0,
            "top": [_row(d) for d in swept[:10]],
        }
        print(
            f"{key}: best {best.candidate.name} {best.time_s.mean / 3600:.3f} h; plan "
            f"{pick.candidate.name} {pick.time_s.mean / 3600:.3f} h "
            f"({100 * out[key]['pick_vs_best']:+.2f}%)"
        )
    print(f"32-GPU plan: {wall:.1f} s wall, {cpu:.1f} s CPU")
    return out


def large_part() -> dict[str, Any]:
    from dynsched_sim import load_scenario

    sc = load_scenario("large").with_values(schedule={"ppo_mini_batch_size": 512})
    p, wall, cpu = _timed(sc, 1024)
    print(
        f"1,024-GPU plan: {wall:.1f} s wall, {cpu:.1f} s CPU, pick {p.best.candidate.name} "
        f"{p.best.time_s.mean / 3600:.3f} h, {p.candidates} candidates, "
        f"{len(p.ranked)} simulated"
    )
    return {
        "scenario": "large, ppo_mini_batch_size 512, 1,024 GPUs",
        "plan_wall_s": wall,
        "plan_cpu_s": cpu,
        "plan_pick": _row(p.best),
        "simulated": len(p.ranked),
        "candidates": p.candidates,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument(
        "--timing-only",
        action="store_true",
        help="only the two plans' wall and CPU times (default out: results/sim_plan_timing.json)",
    )
    args = ap.parse_args()
    if args.timing_only and args.out == str(DEFAULT_OUT):
        args.out = str(DEFAULT_OUT.with_name("sim_plan_timing.json"))
    result: dict[str, Any] = {"seed_qwen35": seed_part(args.quick, args.timing_only)}
    if not args.skip_large:
        result["large_1024"] = large_part()
    result["targets"] = {"within_best": 0.01, "plan_32_s": 60, "plan_1024_s": 300}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
