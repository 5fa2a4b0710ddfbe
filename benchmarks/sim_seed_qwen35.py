"""Benchmark: the full seed-qwen35 comparison (three configurations) on one core.

Reports, per run and in total: real seconds, simulated seconds per real second and
event-loop events (callbacks scheduled) per real second. Target: the three configurations
of one workload seed in under 30 s (``--seeds K`` runs seeds ``0..K-1`` and reports the
time per seed).

    hatch run python benchmarks/sim_seed_qwen35.py [--seeds K] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

TARGET_S = 30.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON line instead of a table")
    ap.add_argument("--out", help="also write the JSON summary to this file")
    ap.add_argument("--seeds", type=int, default=1, help="workload seeds 0..K-1 (default 1)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    from dynsched_sim import load_scenario
    from dynsched_sim._sim import policy_for, run_configuration

    sc = load_scenario("seed-qwen35")
    rows = []
    t_all = time.perf_counter()
    for seed, conf in [(s, c) for s in range(args.seeds) for c in sc.configurations]:
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
    total = time.perf_counter() - t_all
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
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
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
