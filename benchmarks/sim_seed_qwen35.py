"""Benchmark: the full seed-qwen35 comparison (three configurations) on one core.

Reports, per run and in total: real seconds, simulated seconds per real second and
event-loop events (callbacks scheduled) per real second. Target: the three configurations
of one workload seed in under 30 s (``--seeds K`` runs seeds ``0..K-1`` and reports the
time per seed).

    hatch run python benchmarks/sim_seed_qwen35.py [--seeds K] [--json] [--out FILE]
    hatch run python benchmarks/sim_seed_qwen35.py --ratios --seeds 5 [--scenario FILE]

``--ratios`` also runs every other static split of the 32 GPUs (``static-24-8``) and
prints the seed prediction: per configuration the mean +- standard deviation of the
wall-clock over the seeds, the seed-paired ratios ``static / dynamic`` against the
published ratios (1.212 against 16+16, 1.181 against 8+24) and against the **best static
split of all splits of the same GPUs** (`dynsched_sim._scenario.static_splits`). The
speed figures count the scenario's three configurations only. ``--scenario`` takes a
calibrated scenario file (`python -m dynsched_sim.calibrate --out FILE`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

TARGET_S = 30.0


PREDICTED = "dynamic-16-16"


def _spread(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
    }


def prediction(sc: Any, runs: list[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """Per configuration the wall-clock over the seeds; seed-paired ``static / dynamic``
    ratios against each static split, the best static split (of all splits) and the
    published ratios."""
    wall: dict[str, dict[int, float]] = {}
    for r in runs:
        wall.setdefault(r["configuration"], {})[r["seed"]] = r["simulated_s"]
    dyn = wall[PREDICTED]
    statics = sorted(k for k in wall if k.startswith("static"))
    best = [min(wall[k][s] for k in statics) for s in range(seeds)]
    out: dict[str, Any] = {
        "seeds": seeds,
        "wall_clock_h": {k: _spread([v / 3600 for v in w.values()]) for k, w in wall.items()},
        "ratio_vs": {k: _spread([wall[k][s] / dyn[s] for s in range(seeds)]) for k in statics},
        "ratio_vs_best_static": _spread([best[s] / dyn[s] for s in range(seeds)]),
        "best_static_by_mean": min(statics, key=lambda k: statistics.fmean(wall[k].values())),
        "published_ratio_vs": {
            k: sc.published[k] / sc.published[PREDICTED] for k in statics if k in sc.published
        },
        "residual": statistics.fmean(dyn.values()) / sc.published[PREDICTED] - 1
        if PREDICTED in sc.published
        else None,
    }
    return out


def format_prediction(p: dict[str, Any]) -> str:
    """The seed prediction as lines of text."""
    lines = [f"seed prediction over {p['seeds']} seed(s) (mean ± sd):"]
    for k, w in p["wall_clock_h"].items():
        lines.append(f"  {k:<16} {w['mean']:.3f} ± {w['std']:.3f} h")
    for k, r in p["ratio_vs"].items():
        pub = p["published_ratio_vs"].get(k)
        shown = f" (published {pub:.3f})" if pub is not None else ""
        lines.append(f"  {k} / {PREDICTED}: {r['mean']:.3f} ± {r['std']:.3f}{shown}")
    b = p["ratio_vs_best_static"]
    lines.append(
        f"  best static split (all splits, per seed) / {PREDICTED}: {b['mean']:.3f} ± "
        f"{b['std']:.3f}; best by mean: {p['best_static_by_mean']}"
    )
    if p["residual"] is not None:
        lines.append(f"  residual of the prediction: {p['residual']:+.1%}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON line instead of a table")
    ap.add_argument("--out", help="also write the JSON summary to this file")
    ap.add_argument("--seeds", type=int, default=1, help="workload seeds 0..K-1 (default 1)")
    ap.add_argument("--ratios", action="store_true", help="every static split; seed prediction")
    ap.add_argument("--scenario", default="seed-qwen35", help="built-in name or scenario file")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    from dynsched_sim import load_scenario
    from dynsched_sim._scenario import static_splits
    from dynsched_sim._sim import policy_for, run_configuration

    sc = load_scenario(args.scenario)
    confs = list(sc.configurations)
    extra = [c for c in static_splits(sc) if c not in confs] if args.ratios else []
    rows, others = [], []
    for seed, conf in [(s, c) for s in range(args.seeds) for c in confs + extra]:
        if conf in extra:
            r = run_configuration(sc, conf, "static_fully_async", seed=seed)
            others.append({"configuration": conf.name, "seed": seed, "simulated_s": r.wall_clock_s})
            continue
        t0 = time.perf_counter()
        r = run_configuration(sc, conf, policy_for(conf, "default"), seed=seed)
        wall = time.perf_counter() - t0
        rows.append(
            {
                "configuration": conf.name,
                "seed": seed,
                "real_s": wall,
                "simulated_s": r.wall_clock_s,
                "sim_s_per_real_s": r.wall_clock_s / wall,
                "events": r.events,
                "events_per_s": r.events / wall,
            }
        )
    total = sum(r["real_s"] for r in rows)
    per_seed = total / args.seeds
    summary = {
        "benchmark": "sim_seed_qwen35",
        "total_real_s": total,
        "seeds": args.seeds,
        "real_s_per_seed": per_seed,
        "target_s": TARGET_S,
        "within_target": per_seed < TARGET_S,
        "sim_s_per_real_s": sum(r["simulated_s"] for r in rows) / total,
        "events_per_s": sum(r["events"] for r in rows) / total,
        "runs": rows,
    }
    if args.ratios:
        summary["prediction"] = prediction(sc, rows + others, args.seeds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    if args.ratios:
        print(format_prediction(summary["prediction"]), file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{'configuration':<16}{'seed':>5}{'real s':>8}{'simulated h':>13}{'sim s / real s':>16}{'events':>10}{'events/s':>10}"
        )
        for r in rows:
            print(
                f"{r['configuration']:<16}{r['seed']:>5}{r['real_s']:>8.2f}{r['simulated_s'] / 3600:>13.3f}"
                f"{r['sim_s_per_real_s']:>16.0f}{r['events']:>10d}{r['events_per_s']:>10.0f}"
            )
        print(
            f"total {total:.2f} s, {per_seed:.2f} s per seed (target < {TARGET_S:.0f} s: "
            f"{'ok' if per_seed < TARGET_S else 'MISSED'}); "
            f"{summary['sim_s_per_real_s']:.0f} simulated s per real s; {summary['events_per_s']:.0f} events/s"
        )
    return 0 if per_seed < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
