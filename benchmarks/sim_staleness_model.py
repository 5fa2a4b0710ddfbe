"""Check: the closed-form mean staleness against the staleness the simulator measures.

For every configuration of every built-in scenario, of the development draws of the
held-out family (``heldout_scenario(0..59)``) and, reported last, of the held-out draws
(``HELD_OUT_FIRST_DRAW + 0..19``), runs the simulator (static configurations with
``static_fully_async``; dynamic ones with ``default`` and ``static_fully_async``) over a
few workload seeds (built-ins: ``--seeds``, default 3; development draws: 1; held-out
draws: 2) and compares the measured mean staleness (policy versions behind per
consumed sample, by the first token's version: `RunResult.staleness`) with
`dynsched_sim.predicted_staleness_for` for the same seed. Prints one table per family
(scenario, configuration, policy, predicted, measured mean ± std over seeds, relative
error of the mean) and the largest and median relative errors; writes JSON.

    hatch run python benchmarks/sim_staleness_model.py [--quick] [--out FILE]

``--quick`` (CI-sized): 1 seed, draws 0..9 and held-out draws 0..4.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

TARGET = 0.10  # the target: within 10% of the simulated mean
DEFAULT_OUT = Path(__file__).parent / "results" / "sim_staleness_model.json"


def _rows(scenario: Any, seeds: list[int]) -> list[dict[str, Any]]:
    """One row per configuration and policy of ``scenario`` over ``seeds``."""
    from dynsched_sim import predicted_staleness_for, run_configuration

    rows = []
    for conf in scenario.configurations:
        for policy in ("default", "static_fully_async") if conf.hybrid else ("static_fully_async",):
            runs = [run_configuration(scenario, conf, policy, seed=s) for s in seeds]
            measured = [r.staleness["mean"] for r in runs]
            predicted = [predicted_staleness_for(scenario, conf, policy, seed=s) for s in seeds]
            mean_m, mean_p = statistics.fmean(measured), statistics.fmean(predicted)
            rows.append(
                {
                    "scenario": scenario.name,
                    "configuration": conf.name,
                    "policy": policy,
                    "seeds": seeds,
                    "predicted": mean_p,
                    "measured": mean_m,
                    "measured_std": statistics.stdev(measured) if len(measured) > 1 else 0.0,
                    "measured_p95": max(r.staleness["p95"] for r in runs),
                    "measured_max": max(r.staleness["max"] for r in runs),
                    "relative_error": (mean_p - mean_m) / mean_m if mean_m > 0 else None,
                    "absolute_error": mean_p - mean_m,
                }
            )
    return rows


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["relative_error"]) for r in rows if r["relative_error"] is not None]
    worst = max(rows, key=lambda r: abs(r["relative_error"] or 0.0)) if rows else None
    return {
        "rows": len(rows),
        "max_relative_error": max(errs, default=0.0),
        "median_relative_error": statistics.median(errs) if errs else 0.0,
        "within_target": sum(e <= TARGET for e in errs),
        "worst": None
        if worst is None
        else f"{worst['scenario']}/{worst['configuration']}/{worst['policy']}",
        "zero_measured": sum(r["relative_error"] is None for r in rows),
    }


def _table(title: str, rows: list[dict[str, Any]]) -> str:
    out = [
        title,
        f"{'scenario':24s} {'configuration':16s} {'policy':18s} {'pred':>6s} {'measured':>14s} {'rel.err':>8s}",
    ]
    for r in rows:
        err = "-" if r["relative_error"] is None else f"{r['relative_error']:+.1%}"
        out.append(
            f"{r['scenario']:24s} {r['configuration']:16s} {r['policy']:18s} {r['predicted']:6.3f} "
            f"{r['measured']:7.3f} ±{r['measured_std']:.3f} {err:>8s}"
        )
    s = _summary(rows)
    out.append(
        f"-> {s['rows']} rows: max |rel. error| {s['max_relative_error']:.1%} ({s['worst']}), "
        f"median {s['median_relative_error']:.1%}, within {TARGET:.0%}: {s['within_target']}"
    )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, fewer draws (CI-sized)")
    ap.add_argument("--seeds", type=int, default=None, help="workload seeds per configuration")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output file")
    args = ap.parse_args()
    from dynsched_sim import HELD_OUT_FIRST_DRAW, builtin_scenarios, heldout_scenario, load_scenario

    seeds = args.seeds or (1 if args.quick else 3)
    dev_draws = range(10 if args.quick else 60)
    held_draws = range(5 if args.quick else 20)
    started = time.perf_counter()
    families: dict[str, list[dict[str, Any]]] = {"builtin": [], "development": [], "heldout": []}
    for name in builtin_scenarios():
        sc = load_scenario(name)
        families["builtin"] += _rows(sc, [sc.seed + i for i in range(seeds)])
    for d in dev_draws:  # draws 0..59: developed on
        families["development"] += _rows(heldout_scenario(d), [d])
    for d in held_draws:  # reported last: nothing was tuned on them
        sc = heldout_scenario(HELD_OUT_FIRST_DRAW + d)
        families["heldout"] += _rows(sc, [sc.seed + 10_000 * i for i in range(min(seeds, 2))])
    titles = {
        "builtin": "built-in scenarios",
        "development": "development draws heldout_scenario(0..59)",
        "heldout": f"held-out draws heldout_scenario({HELD_OUT_FIRST_DRAW}..) (reported last)",
    }
    for key, rows in families.items():
        print(_table(titles[key], rows))
        print()
    result = {
        "benchmark": "sim_staleness_model",
        "quick": args.quick,
        "target_relative_error": TARGET,
        "seconds": time.perf_counter() - started,
        "summary": {k: _summary(v) for k, v in families.items()},
        "rows": families,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
