"""Pollux-workload evaluation of the Optimus family against Tiresias, DRF and the rest.

Development set: workloads 1-8 at load 1.0 (the ``optimus+`` defaults were chosen there,
on workloads 1-2).  Held-out sets, never tuned on: loads 0.5, 1.5, 2.0 and the
``realistic`` workloads under ``shared/data/pollux/``.  For every (load, workload,
scheduler) the average JCT and the makespan are recorded; the JSON is rewritten after
every run, so an interrupted sweep keeps what it finished.

Run (CPU heavy; at most two shards at once on a shared 2-core machine)::

    nice hatch run python benchmarks/optimus_pollux_eval.py --out benchmarks/results/optimus_pollux_eval.json \
        [--loads 1.0,0.5,1.5,2.0,realistic] [--workloads 1-8] \
        [--schedulers tiresias,optimus+,optimus,optimus-oracle,drf] [--shard 0/2]

``--summary FILE [FILE ...]`` merges shard files and prints the tables (per-workload
JCT and makespan, the mean per load, and how often ``optimus+`` beats each scheduler).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from dynsched_optimus.cluster import SimConfig, run_pollux


def _workloads(spec: str) -> list[str]:
    out: list[str] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += [f"workload-{i}" for i in range(int(a), int(b) + 1)]
        else:
            out.append(f"workload-{part}")
    return out


def run(args: argparse.Namespace) -> None:
    loads = args.loads.split(",")
    scheds = args.schedulers.split(",")
    tasks = [(ld, wl, s) for ld in loads for wl in _workloads(args.workloads) for s in scheds]
    k, n = (int(x) for x in args.shard.split("/"))
    tasks = tasks[k::n]
    out_path = Path(args.out)
    results: list[dict[str, object]] = []
    if out_path.exists():
        results = json.loads(out_path.read_text())["runs"]
    done = {(r["load"], r["workload"], r["scheduler"]) for r in results}
    for ld, wl, s in tasks:
        if (ld, wl, s) in done:
            continue
        t0 = time.perf_counter()
        res = run_pollux(wl, s, load=ld, config=SimConfig(seed=args.seed))
        row = {
            "load": ld,
            "workload": wl,
            "scheduler": s,
            "seed": args.seed,
            "avg_jct_s": res.avg_jct,
            "makespan_s": res.makespan,
            "overhead_share": res.overhead_share,
            "unfinished": len(res.unfinished),
            "wall_s": time.perf_counter() - t0,
        }
        results.append(row)
        print(json.dumps(row), flush=True)
        out_path.write_text(json.dumps({"command": vars(args), "runs": results}, indent=1))


def summary(files: list[str]) -> None:
    runs: dict[tuple[str, str, str], dict[str, float]] = {}
    for f in files:
        for r in json.loads(Path(f).read_text())["runs"]:
            runs[(r["load"], r["workload"], r["scheduler"])] = r
    loads = sorted({k[0] for k in runs})
    scheds = sorted({k[2] for k in runs})
    for ld in loads:
        wls = sorted({k[1] for k in runs if k[0] == ld}, key=lambda w: int(w.split("-")[1]))
        print(f"\nload {ld}: average JCT s / makespan s\n")
        print(
            "| scheduler | "
            + " | ".join(w.split("-")[1] for w in wls)
            + " | mean JCT | mean makespan |"
        )
        print("|---" * (len(wls) + 3) + "|")
        for s in scheds:
            row = [runs.get((ld, w, s)) for w in wls]
            if not any(row):
                continue
            cells = [
                f"{r['avg_jct_s']:.0f} / {r['makespan_s'] / 3600:.1f}h" if r else "-" for r in row
            ]
            jcts = [r["avg_jct_s"] for r in row if r]
            mks = [r["makespan_s"] for r in row if r]
            full = len(jcts) == len(wls)
            mean_j = f"{statistics.mean(jcts):.0f}" + ("" if full else "*")
            mean_m = f"{statistics.mean(mks) / 3600:.2f}h" + ("" if full else "*")
            print(f"| {s} | " + " | ".join(cells) + f" | {mean_j} | {mean_m} |")
        if "optimus+" in scheds:
            print()
            for s in scheds:
                if s == "optimus+":
                    continue
                pairs = [
                    (runs[(ld, w, "optimus+")]["avg_jct_s"], runs[(ld, w, s)]["avg_jct_s"])
                    for w in wls
                    if (ld, w, "optimus+") in runs and (ld, w, s) in runs
                ]
                if pairs:
                    wins = sum(a < b for a, b in pairs)
                    ratio = statistics.mean(a for a, _ in pairs) / statistics.mean(
                        b for _, b in pairs
                    )
                    print(
                        f"optimus+ vs {s}: lower JCT on {wins}/{len(pairs)} workloads, "
                        f"mean ratio {ratio:.3f} (over the workloads both finished)"
                    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--loads", default="1.0")
    p.add_argument("--workloads", default="1-8")
    p.add_argument("--schedulers", default="tiresias,optimus+")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard", default="0/1")
    p.add_argument("--out", default="optimus_pollux_eval.json")
    p.add_argument("--summary", nargs="*", default=None)
    args = p.parse_args()
    if args.summary is not None:
        summary(args.summary or [args.out])
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
