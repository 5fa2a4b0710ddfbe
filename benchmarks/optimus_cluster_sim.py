"""Benchmark of the dynsched-optimus cluster simulator (issue 8).

One 160-job Pollux workload under every scheduler on one core: wall time, simulated
time and wall seconds per simulated hour. With ``--full``, the whole 8-workload
comparison for ``optimus`` and ``optimus+`` (target: under 10 minutes in total).

Run: ``hatch run test:python benchmarks/optimus_cluster_sim.py [--workload workload-1] [--full]``
"""

from __future__ import annotations

import argparse
import json
import time

from dynsched_optimus.cluster import SCHEDULERS, SimConfig, format_table, run_pollux


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="workload-1")
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--full", action="store_true", help="also time the 8-workload comparison")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    rows = []
    for name in args.schedulers.split(","):
        r = run_pollux(args.workload, name, config=SimConfig())
        rows.append(
            {
                "scheduler": name,
                "wall_s": round(r.wall_s, 2),
                "sim_hours": round(r.simulated_s / 3600, 1),
                "wall_s_per_sim_hour": round(r.wall_s / (r.simulated_s / 3600), 4),
                "avg_jct_s": round(r.avg_jct, 1),
                "p99_jct_s": round(r.p99_jct, 1),
                "makespan_s": round(r.makespan, 1),
                "gpu_util": round(r.gpu_utilization, 3),
                "overhead_share": round(r.overhead_share, 4),
                "restarts": sum(r.restarts.values()),
            }
        )
        print(rows[-1], flush=True)
    print(format_table(rows, list(rows[0])))
    out: dict[str, object] = {"single": rows}
    if args.full:
        t0 = time.perf_counter()
        per: dict[str, dict[str, float]] = {"optimus": {}, "optimus+": {}}
        for i in range(1, 9):
            for name in per:
                r = run_pollux(f"workload-{i}", name, config=SimConfig())
                per[name][f"workload-{i}"] = r.avg_jct
        total = time.perf_counter() - t0
        print(f"8-workload comparison (optimus, optimus+): {total:.1f} s (target < 600 s)")
        out["full_s"] = total
        out["full_avgs"] = per
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
